//! `weft simulate --report` and the topology drawings in a real headless Chromium: the page loads
//! with no console error, every chart has rendered (an SVG with a non-empty box, axis tick labels
//! and both axis descriptions, measured in the live DOM), every node picture has rendered, and
//! whole-page screenshots are kept under `<target>/report-browser/` (report.png, topo-<type>.png,
//! and the pages themselves).
//!
//! Decision: the test drives Chromium over the DevTools protocol (the `headless_chrome` crate)
//! rather than `--dump-dom` with `--enable-logging=stderr`. The dumped DOM of a static page is
//! its source, so it cannot tell a chart that renders from one that does not (an SVG with a bad
//! path or a zero-size box dumps the same); over the protocol the test asks the live page for
//! each SVG's rendered box and text, receives console messages and uncaught exceptions as
//! events (not by matching log lines, whose format changes between Chromium releases), and takes
//! the screenshot in the same session. Chromium is the Debian package `chromium`, which
//! scripts/test-all.sh installs; without it the test goes through `weft_testkit::require`, so
//! CI, which has it, always runs it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use headless_chrome::protocol::cdp::Page;
use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::protocol::cdp::types::Event;
use headless_chrome::{Browser, LaunchOptions, Tab};

/// `<target>/report-browser`: beside the profile directory of this test binary
/// (`<target>/debug/deps/<test>`).
fn artefacts() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe.ancestors().nth(3).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("report-browser");
    std::fs::create_dir_all(&dir).expect("artefact directory");
    dir
}

fn weft(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft runs");
    assert!(out.status.success(), "weft {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A headless Chromium, or None (the test skips) when none is installed.
fn browser() -> Option<Browser> {
    let path = weft_testkit::require_ok(
        headless_chrome::browser::default_executable().map_err(|e| format!("Chromium (Debian package chromium): {e}")),
    )?;
    let options = LaunchOptions::default_builder()
        .path(Some(path))
        .headless(true)
        // Root (CI) cannot use Chromium's sandbox.
        .sandbox(false)
        .window_size(Some((1400, 1000)))
        // The default 30 s without a DevTools event closes the browser; a loaded CI machine
        // running debug weft between two pages can take longer than that.
        .idle_browser_timeout(std::time::Duration::from_secs(300))
        .build()
        .expect("launch options");
    Some(Browser::new(options).expect("Chromium starts"))
}

/// Open `file` in a new tab with console errors, error log entries and uncaught exceptions
/// collected; returns the tab and what it collected.
fn open(browser: &Browser, file: &Path) -> (Arc<Tab>, Arc<Mutex<Vec<String>>>) {
    let tab = browser.new_tab().expect("tab");
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    tab.add_event_listener(Arc::new(move |event: &Event| {
        let error = match event {
            Event::RuntimeConsoleAPICalled(e) if format!("{:?}", e.params.Type) == "Error" => {
                Some(format!("console.error: {:?}", e.params.args))
            }
            Event::LogEntryAdded(e) if format!("{:?}", e.params.entry.level) == "Error" => {
                Some(format!("log: {} ({:?})", e.params.entry.text, e.params.entry.url))
            }
            Event::RuntimeExceptionThrown(e) => Some(format!("exception: {:?}", e.params.exception_details)),
            _ => None,
        };
        if let Some(error) = error {
            sink.lock().expect("errors").push(error);
        }
    }))
    .expect("listener");
    tab.enable_runtime().expect("Runtime domain");
    tab.enable_log().expect("Log domain");
    let url = format!("file://{}", file.canonicalize().expect("page path").display());
    tab.navigate_to(&url).expect("navigate").wait_until_navigated().expect("page loads");
    (tab, errors)
}

/// The value of a JavaScript expression that returns a JSON string.
fn eval_json(tab: &Tab, expression: &str) -> serde_json::Value {
    let value = tab.evaluate(expression, false).expect("evaluate").value.expect("a value");
    serde_json::from_str(value.as_str().expect("a JSON string")).expect("JSON")
}

/// A PNG of the whole page (beyond the window), written to `file`.
fn screenshot(tab: &Tab, file: &Path) {
    let size =
        eval_json(tab, "JSON.stringify([document.documentElement.scrollWidth, document.documentElement.scrollHeight])");
    let (width, height) = (size[0].as_f64().expect("width"), size[1].as_f64().expect("height"));
    let shot = tab
        .call_method(Page::CaptureScreenshot {
            format: Some(CaptureScreenshotFormatOption::Png),
            quality: None,
            clip: Some(Page::Viewport { x: 0.0, y: 0.0, width, height, scale: 1.0 }),
            from_surface: Some(true),
            capture_beyond_viewport: Some(true),
            optimize_for_speed: None,
        })
        .expect("screenshot");
    let png = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, shot.data).expect("base64 PNG");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 1000, "a screenshot with something in it");
    std::fs::write(file, png).expect("write screenshot");
}

/// Per SVG under `selector`: its id (the figure's), rendered width and height, and its texts.
const MEASURE: &str = r#"JSON.stringify(Array.from(document.querySelectorAll(SELECTOR)).map(f => {
  const svg = f.querySelector('svg');
  if (!svg) return {id: f.id, width: 0, height: 0, texts: [], drawn: 0};
  const box = svg.getBoundingClientRect();
  const texts = Array.from(svg.querySelectorAll('text'))
    .filter(t => t.getComputedTextLength() > 0)
    .map(t => t.textContent.trim()).filter(t => t.length > 0);
  const drawn = Array.from(svg.querySelectorAll('line, polyline, path, rect, circle'))
    .filter(e => { const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length;
  return {id: f.id, width: box.width, height: box.height, texts: texts, drawn: drawn};
}))"#;

fn measure(tab: &Tab, selector: &str) -> Vec<serde_json::Value> {
    eval_json(tab, &MEASURE.replace("SELECTOR", &format!("{selector:?}"))).as_array().expect("array").clone()
}

#[test]
fn the_report_loads_without_errors_and_every_chart_renders() {
    let Some(browser) = browser() else { return };
    let dir = artefacts();
    let page = dir.join("report.html");
    let page_arg = page.to_str().expect("UTF-8 path");
    weft(&["simulate", "--nodes", "16", "--pods", "1200", "--seed", "3", "--report", page_arg]);
    let html = std::fs::read_to_string(&page).expect("report written");
    // Self-contained: nothing to fetch.
    for external in ["http://", "https://", "<script src", "<link", "@import", "url("] {
        let found = html.match_indices(external).find(|(i, _)| {
            // The SVG namespace URIs are names, not fetches.
            !html[*i..].starts_with("http://www.w3.org/")
        });
        assert!(found.is_none(), "the report refers to something outside it: {external}");
    }

    let (tab, errors) = open(&browser, &page);
    // Eight charts: four over time, three distributions, utilisation per node type.
    let charts = measure(&tab, "figure.chart");
    let ids: Vec<&str> = charts.iter().map(|c| c["id"].as_str().expect("id")).collect();
    assert_eq!(
        ids,
        ["running", "not-placed", "gpus-in-use", "stranded", "ring-cdf", "pair-cdf", "vf-cdf", "utilisation"],
        "the charts, in order"
    );
    let descriptions: [(&str, &[&str]); 8] = [
        ("running", &["time (hours)", "pods"]),
        ("not-placed", &["time (hours)", "pods"]),
        ("gpus-in-use", &["time (hours)", "GPUs"]),
        ("stranded", &["time (hours)", "GPUs"]),
        ("ring-cdf", &["GB/s per direction", "share of pods"]),
        ("pair-cdf", &["GB/s per direction", "share of pods"]),
        (
            "vf-cdf",
            &[
                "PCIe relation of the VF's NIC to the nearest GPU of its pod",
                "share of VFs at least this near",
                "PIX",
                "SYS",
            ],
        ),
        ("utilisation", &["node type", "share of GPU time"]),
    ];
    for (chart, (id, labels)) in charts.iter().zip(descriptions) {
        let (w, h) = (chart["width"].as_f64().expect("width"), chart["height"].as_f64().expect("height"));
        assert!(w > 300.0 && h > 200.0, "{id}: rendered {w}x{h}");
        let texts: Vec<&str> = chart["texts"].as_array().expect("texts").iter().filter_map(|t| t.as_str()).collect();
        for label in labels {
            assert!(texts.contains(label), "{id}: no '{label}' rendered: {texts:?}");
        }
        let ticks = texts.iter().filter(|t| t.replace(',', "").parse::<f64>().is_ok()).count();
        assert!(ticks >= 4, "{id}: axis tick labels rendered: {texts:?}");
        for policy in ["weft", "blind", "least-allocated"] {
            assert!(texts.contains(&policy), "{id}: legend names {policy}: {texts:?}");
        }
        assert!(chart["drawn"].as_u64().expect("drawn") >= 10, "{id}: lines and shapes drawn: {chart}");
    }
    // Node pictures: the first node of each type (at most four) under each of the three policies.
    let nodes = measure(&tab, "figure.node");
    assert_eq!(nodes.len(), 4 * 3, "{nodes:?}");
    for n in &nodes {
        assert!(n["width"].as_f64().expect("width") > 100.0, "{n}");
        assert!(n["texts"].as_array().expect("texts").iter().any(|t| t == "GPU0"), "{n}");
    }
    screenshot(&tab, &dir.join("report.png"));
    let errors = errors.lock().expect("errors").clone();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}

#[test]
fn each_shipped_topology_drawing_renders_with_its_labels() {
    let Some(browser) = browser() else { return };
    let dir = artefacts();
    for (name, _) in weft_sim::builtin_types() {
        let svg = weft(&["topo", "show", &format!("builtin:{name}"), "-o", "svg", "--highlight", "0,1"]);
        let file = dir.join(format!("topo-{name}.svg"));
        std::fs::write(&file, &svg).expect("write drawing");
        let (tab, errors) = open(&browser, &file);
        let measured = eval_json(
            &tab,
            r#"JSON.stringify((() => {
  const svg = document.documentElement;
  const box = svg.getBoundingClientRect();
  const texts = Array.from(svg.querySelectorAll('text')).filter(t => t.getComputedTextLength() > 0)
    .map(t => t.textContent.trim());
  return {width: box.width, height: box.height, texts: texts,
          rings: svg.querySelectorAll('circle.highlight').length};
})())"#,
        );
        assert!(measured["width"].as_f64().expect("width") > 300.0, "{name}: {measured}");
        let texts: Vec<&str> = measured["texts"].as_array().expect("texts").iter().filter_map(|t| t.as_str()).collect();
        let node = weft_sim::builtin_topology(name).expect("built-in");
        for g in 0..node.gpu_count() {
            assert!(texts.contains(&format!("GPU{g}").as_str()), "{name}: GPU{g} rendered: {texts:?}");
        }
        assert!(texts.contains(&"Legend"), "{name}: legend rendered");
        assert_eq!(measured["rings"], 2, "{name}: GPUs 0 and 1 ringed");
        screenshot(&tab, &dir.join(format!("topo-{name}.png")));
        let errors = errors.lock().expect("errors").clone();
        assert!(errors.is_empty(), "{name}: console errors: {errors:?}");
    }
}
