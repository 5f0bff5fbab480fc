//! The connection limits every weft server shares (`weft_kube::http`), over real TCP on loopback,
//! with clients that behave as a slow or hostile one would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use weft_kube::http::{ServeOptions, serve};

/// Longest any step here may take before the test is declared hung (a guard, not a measurement).
const HANG_GUARD: Duration = Duration::from_secs(30);

fn app() -> Router {
    Router::new().route("/echo", post(|body: Bytes| async move { body }))
}

struct Server {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(opts: ServeOptions) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, app(), None, opts, async move {
        let _ = rx.await;
    }));
    Server { addr, stop: Some(tx), task }
}

/// Reads until the server closes the connection; what it sent meanwhile.
async fn read_to_close(conn: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(HANG_GUARD, async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server never closed the connection");
    got
}

/// One keep-alive request on `conn`; returns the response head and body text.
async fn request(conn: &mut TcpStream, body: &str) -> String {
    let req = format!("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(HANG_GUARD, async {
        while !String::from_utf8_lossy(&got).ends_with(body) || !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("no answer");
    String::from_utf8(got).unwrap()
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    let server = start(ServeOptions {
        header_read_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(400),
        ..ServeOptions::default()
    })
    .await;
    let mut partial = TcpStream::connect(server.addr).await.unwrap();
    partial.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nX-Slow: ").await.unwrap();
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let answer = read_to_close(&mut partial).await;
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"), "no request was served: {answer:?}");
    read_to_close(&mut silent).await;
    // A complete request on a fresh connection is still served.
    let mut ok = TcpStream::connect(server.addr).await.unwrap();
    assert!(request(&mut ok, "hello").await.starts_with("HTTP/1.1 200 OK"));
    // And a keep-alive connection left idle after its request is closed too.
    read_to_close(&mut ok).await;
    server.stop.unwrap().send(()).unwrap();
    server.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_on_accept() {
    let opts =
        ServeOptions { max_connections: 2, header_read_timeout: Duration::from_secs(60), ..ServeOptions::default() };
    let server = start(opts.clone()).await;
    let mut first = TcpStream::connect(server.addr).await.unwrap();
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    // Both are served (and so counted) before the third arrives.
    assert!(request(&mut first, "one").await.starts_with("HTTP/1.1 200 OK"));
    assert!(request(&mut second, "two").await.starts_with("HTTP/1.1 200 OK"));
    let mut third = TcpStream::connect(server.addr).await.unwrap();
    let _ = third.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx").await;
    let answer = read_to_close(&mut third).await;
    assert!(answer.is_empty(), "the connection over the cap got an answer: {answer:?}");
    assert_eq!(opts.refused_connections(), 1);
    // The two within the cap keep working; once one closes there is room again.
    assert!(request(&mut first, "again").await.starts_with("HTTP/1.1 200 OK"));
    drop(second);
    let mut fourth = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let mut c = TcpStream::connect(server.addr).await.unwrap();
            let req = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nroom";
            if c.write_all(req.as_bytes()).await.is_ok() {
                let mut buf = [0u8; 64];
                if matches!(c.read(&mut buf).await, Ok(n) if n > 0) {
                    return c;
                }
            }
            // The closed connection's slot is released when its task ends; try again.
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("no room after a connection closed");
    drop(fourth.shutdown().await);
    server.stop.unwrap().send(()).unwrap();
    server.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_client_that_never_finishes() {
    let opts = ServeOptions {
        shutdown_grace: Duration::from_millis(100),
        header_read_timeout: Duration::from_secs(60),
        ..ServeOptions::default()
    };
    let mut server = start(opts).await;
    // Headers promise 100 bytes of body; 10 come. The handler waits for the rest.
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789").await.unwrap();
    // Make sure the request reached the handler: a second, complete request on another
    // connection is answered, so the server is accepting and serving.
    let mut ok = TcpStream::connect(server.addr).await.unwrap();
    assert!(request(&mut ok, "fine").await.starts_with("HTTP/1.1 200 OK"));
    server.stop.take().unwrap().send(()).unwrap();
    let ended = tokio::time::timeout(HANG_GUARD, &mut server.task).await;
    assert!(ended.is_ok(), "serve still waits for the slow client after the grace");
    ended.unwrap().unwrap().unwrap();
    read_to_close(&mut slow).await;
}
