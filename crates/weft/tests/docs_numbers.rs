//! Docs true by construction: every block of generated output in README.md, BENCHMARKS.md and
//! docs/*.md is what the code prints today.
//!
//! A block is
//!
//! ````text
//! <!-- generated: weft simulate --pipelines --seed 5 -->
//! ```text
//! …the command's stdout…
//! ```
//! <!-- end generated -->
//! ````
//!
//! The command is `weft` with plain arguments (no quotes), run from the repository root, optionally
//! followed by `| grep TEXT` to keep only the lines holding TEXT. This test runs each command with
//! the weft binary and compares. Run times vary from run to run: numbers followed by ` ms` are
//! masked, and runs of spaces and table rules are collapsed, so a column that widens by a digit does
//! not count as a change. A block marked `<!-- generated, regen only: … -->` is too slow for a debug
//! test (the whole matrix on 5,000 nodes): it is rewritten by the regeneration but not checked.
//!
//! `scripts/regen-docs.sh` rewrites every block (it runs this test with `WEFT_REGEN_DOCS=1`, and
//! `WEFT_DOCS_BIN` set to a release build of weft).

use std::path::{Path, PathBuf};
use std::process::Command;

const OPEN: &str = "<!-- generated: ";
const OPEN_REGEN_ONLY: &str = "<!-- generated, regen only: ";
const CLOSE: &str = "<!-- end generated -->";

/// One block of generated output in a file.
#[derive(Debug, PartialEq)]
struct Block {
    /// 1-based line of the opening marker.
    line: usize,
    /// The command (`weft …`, maybe `| grep …`).
    command: String,
    /// Checked by the test (false: regen only).
    checked: bool,
    /// Byte range of the output between the fences (whole lines, each ending in a newline).
    body: std::ops::Range<usize>,
}

/// The blocks of `text`, or what is wrong with one (naming its line).
fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        offset += line.len();
        let trimmed = line.trim_end();
        let (command, checked) = if let Some(rest) = trimmed.strip_prefix(OPEN) {
            (rest, true)
        } else if let Some(rest) = trimmed.strip_prefix(OPEN_REGEN_ONLY) {
            (rest, false)
        } else {
            if trimmed == CLOSE {
                return Err(format!("line {}: '{CLOSE}' without a block before it", i + 1));
            }
            continue;
        };
        let Some(command) = command.strip_suffix(" -->") else {
            return Err(format!("line {}: the marker must end with ' -->' on the same line", i + 1));
        };
        let fence = lines.next().map(|(_, l)| {
            offset += l.len();
            l.trim_end()
        });
        if fence != Some("```text") {
            return Err(format!("line {}: the marker must be followed by a ```text fence", i + 1));
        }
        let body_start = offset;
        let mut body_end = None;
        for (_, l) in lines.by_ref() {
            if l.trim_end() == "```" {
                body_end = Some(offset);
                offset += l.len();
                break;
            }
            offset += l.len();
        }
        let Some(body_end) = body_end else {
            return Err(format!("line {}: the block's fence is never closed", i + 1));
        };
        match lines.next() {
            Some((_, l)) if l.trim_end() == CLOSE => offset += l.len(),
            _ => return Err(format!("line {}: the block must end with '{CLOSE}' after its fence", i + 1)),
        }
        out.push(Block { line: i + 1, command: command.trim().to_string(), checked, body: body_start..body_end });
    }
    Ok(out)
}

/// Run a block's command; its stdout (filtered when the command says `| grep TEXT`).
fn run(bin: &Path, root: &Path, command: &str) -> Result<String, String> {
    let (cmd, grep) = match command.split_once(" | grep ") {
        Some((c, pattern)) => (c, Some(pattern.trim())),
        None => (command, None),
    };
    if cmd.contains(['\'', '"', '|', '>', '<', '$', '`']) {
        return Err(format!("'{command}': only plain arguments and one '| grep TEXT' are understood"));
    }
    let mut words = cmd.split_whitespace();
    if words.next() != Some("weft") {
        return Err(format!("'{command}': a generated block runs weft"));
    }
    let out = Command::new(bin)
        .args(words)
        .current_dir(root)
        .output()
        .map_err(|e| format!("'{command}': cannot run {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!("'{command}' failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    let stdout = String::from_utf8(out.stdout).map_err(|e| format!("'{command}': stdout is not UTF-8: {e}"))?;
    Ok(match grep {
        Some(p) => stdout.lines().filter(|l| l.contains(p)).map(|l| format!("{l}\n")).collect(),
        None => stdout,
    })
}

/// The text with what varies between runs taken out: numbers before ` ms` become `#`, runs of
/// spaces and of table rule characters become one, trailing spaces go.
fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let chars: Vec<char> = line.trim_end().chars().collect();
        let mut i = 0;
        let mut line_out = String::new();
        while i < chars.len() {
            let c = chars[i];
            if c.is_ascii_digit() {
                let mut j = i;
                while j < chars.len() && (chars[j].is_ascii_digit() || chars[j] == '.' || chars[j] == ',') {
                    j += 1;
                }
                let number: String = chars[i..j].iter().collect();
                let rest: String = chars[j..chars.len().min(j + 3)].iter().collect();
                let word_start = i == 0 || !chars[i - 1].is_alphanumeric();
                let unit_end = chars.get(j + 3).is_none_or(|c| !c.is_alphanumeric());
                line_out.push_str(if word_start && rest == " ms" && unit_end { "#" } else { &number });
                i = j;
                continue;
            }
            if matches!(c, ' ' | '─' | '═' | '┄' | '╌') {
                let mut j = i;
                while j < chars.len() && chars[j] == c {
                    j += 1;
                }
                line_out.push(c);
                i = j;
                continue;
            }
            line_out.push(c);
            i += 1;
        }
        out.push_str(&line_out);
        out.push('\n');
    }
    out
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// README.md, BENCHMARKS.md and docs/*.md, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn documented_command_output_is_what_the_code_prints() {
    let root = repo_root();
    let bin =
        std::env::var_os("WEFT_DOCS_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weft")), PathBuf::from);
    let regen = std::env::var_os("WEFT_REGEN_DOCS").is_some_and(|v| v == "1");
    let mut problems = Vec::new();
    let mut seen = 0;
    for file in documents(&root) {
        let name = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let found = match blocks(&text) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut rewritten = String::new();
        let mut copied = 0;
        for b in &found {
            seen += 1;
            if !regen && !b.checked {
                continue;
            }
            let output = match run(&bin, &root, &b.command) {
                Ok(o) => o,
                Err(e) => {
                    problems.push(format!("{name}:{}: {e}", b.line));
                    continue;
                }
            };
            if regen {
                rewritten.push_str(&text[copied..b.body.start]);
                rewritten.push_str(&output);
                copied = b.body.end;
            } else if normalise(&text[b.body.clone()]) != normalise(&output) {
                problems.push(format!(
                    "{name}:{}: '{}' prints something else now (run scripts/regen-docs.sh):\n--- documented\n{}--- \
                     printed\n{}",
                    b.line,
                    b.command,
                    &text[b.body.clone()],
                    output
                ));
            }
        }
        if regen && !found.is_empty() {
            rewritten.push_str(&text[copied..]);
            if rewritten != text {
                std::fs::write(&file, rewritten).unwrap_or_else(|e| panic!("{name}: {e}"));
                eprintln!("rewrote {name}");
            }
        }
    }
    problems.extend(pictures(&bin, &root, regen));
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    assert!(seen > 0, "no generated blocks found: README.md's simulate numbers should be one");
}

/// Pictures in docs/img/ that are charts of `weft simulate --report`: the file, the simulate
/// arguments, and the id of the report's figure whose SVG the file holds. Charts carry no run
/// time, so the file must be exactly what the code draws.
const PICTURES: &[(&str, &[&str], &str)] = &[
    ("docs/img/simulate-ring-cdf.svg", &["simulate"], "ring-cdf"),
    ("docs/img/simulate-vf-cdf.svg", &["simulate"], "vf-cdf"),
];

/// The SVG of the figure `id` in a report.
fn figure_svg(html: &str, id: &str) -> Option<String> {
    let figure = html.split(&format!("<figure class=\"chart\" id=\"{id}\">")).nth(1)?;
    let end = figure.find("</svg>")? + "</svg>".len();
    figure[..end].starts_with("<svg").then(|| format!("{}\n", &figure[..end]))
}

/// Check (or with `regen`, rewrite) every file of [`PICTURES`]; the problems found.
fn pictures(bin: &Path, root: &Path, regen: bool) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut problems = Vec::new();
    let mut reports: Vec<(&[&str], String)> = Vec::new();
    for &(file, args, id) in PICTURES {
        if !reports.iter().any(|(a, _)| *a == args) {
            let path = dir.path().join(format!("report-{}.html", reports.len()));
            let out =
                Command::new(bin).args(args).arg("--report").arg(&path).current_dir(root).output().expect("weft runs");
            if !out.status.success() {
                problems
                    .push(format!("{file}: weft {args:?} --report failed: {}", String::from_utf8_lossy(&out.stderr)));
                continue;
            }
            reports.push((args, std::fs::read_to_string(&path).expect("report written")));
        }
        let Some((_, html)) = reports.iter().find(|(a, _)| *a == args) else { continue };
        let Some(drawn) = figure_svg(html, id) else {
            problems.push(format!("{file}: the report has no chart '{id}'"));
            continue;
        };
        let path = root.join(file);
        if regen {
            std::fs::write(&path, &drawn).unwrap_or_else(|e| panic!("{file}: {e}"));
            eprintln!("rewrote {file}");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(drawn.as_str()) {
            problems.push(format!(
                "{file}: not the '{id}' chart that weft {} --report draws now (run scripts/regen-docs.sh)",
                args.join(" ")
            ));
        }
    }
    problems
}

/// README's first screen (its first 60 lines) keeps its two commands at the top, then shows the
/// table as `weft simulate` prints it (a generated block, checked above) and pictures from the
/// report (checked above).
#[test]
fn readme_first_screen_shows_the_table_and_pictures_from_the_report() {
    let text = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let first: Vec<&str> = text.lines().take(60).collect();
    assert_eq!(
        first[..6],
        [
            "# weft",
            "",
            "```sh",
            "cargo run --release -p weft -- simulate      # the main job: weft's GPU placement vs topology-blind baselines",
            "bash scripts/test-all.sh                     # the whole test suite (as root; installs what it needs)",
            "```",
        ],
        "the two commands at the top"
    );
    let screen = first.join("\n");
    let b = blocks(&screen).unwrap_or_else(|e| panic!("README's first screen: {e}"));
    assert!(b.iter().any(|b| b.command == "weft simulate" && b.checked), "the table of `weft simulate`: {b:?}");
    for (file, _, _) in PICTURES {
        assert!(screen.contains(&format!("]({file})")), "README's first screen shows {file}");
    }
}

#[test]
fn blocks_are_found_with_their_command_and_malformed_ones_named_by_line() {
    let text = "intro\n<!-- generated: weft simulate --pods 10 -->\n```text\na\nb\n```\n<!-- end generated -->\n\
                tail\n<!-- generated, regen only: weft simulate | grep x -->\n```text\n```\n<!-- end generated -->\n";
    let b = blocks(text).unwrap();
    assert_eq!(b.len(), 2);
    assert_eq!((b[0].line, b[0].command.as_str(), b[0].checked), (2, "weft simulate --pods 10", true));
    assert_eq!(&text[b[0].body.clone()], "a\nb\n");
    assert_eq!((b[1].line, b[1].command.as_str(), b[1].checked), (9, "weft simulate | grep x", false));
    assert_eq!(&text[b[1].body.clone()], "");
    let cases = [
        ("<!-- generated: weft x -->\nno fence\n", "line 1: the marker must be followed by a ```text fence"),
        ("<!-- generated: weft x -->\n```text\nout\n", "line 1: the block's fence is never closed"),
        ("<!-- generated: weft x -->\n```text\n```\nmore\n", "line 1: the block must end with"),
        ("x\n<!-- end generated -->\n", "line 2: '<!-- end generated -->' without a block"),
        ("<!-- generated: weft x\n", "line 1: the marker must end with ' -->'"),
    ];
    for (t, want) in cases {
        let e = blocks(t).unwrap_err();
        assert!(e.contains(want), "want {want:?}, got {e:?}");
    }
}

#[test]
fn run_times_and_column_widths_do_not_count_other_numbers_do() {
    let a = "│ weft ┆ 4724/5000 ┆ 590 ms   │\n╞══════╪═══════════╪══════════╡\n";
    let b = "│ weft ┆ 4724/5000 ┆ 1590 ms  │\n╞══════╪═══════════╪═════════╡\n";
    assert_eq!(normalise(a), normalise(b));
    let c = "│ weft ┆ 4725/5000 ┆ 590 ms   │\n╞══════╪═══════════╪══════════╡\n";
    assert_ne!(normalise(a), normalise(c), "a placed count is not masked");
    assert_ne!(normalise("took 12 msec"), normalise("took 13 msec"), "only the unit ms is masked");
    assert_ne!(normalise("2.4 ms"), normalise("2.4 s"));
}

#[test]
fn a_command_is_plain_weft_arguments_and_an_optional_grep() {
    let root = repo_root();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_weft"));
    let out = run(&bin, &root, "weft simulate --list-node-types | grep hgx-h100").unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("builtin:hgx-h100"), "{out}");
    assert!(run(&bin, &root, "weft simulate --cluster 'a b'").unwrap_err().contains("only plain arguments"));
    assert!(run(&bin, &root, "ls /").unwrap_err().contains("runs weft"));
    assert!(run(&bin, &root, "weft simulate --nodes 0").unwrap_err().contains("--nodes must be at least 1"));
}
