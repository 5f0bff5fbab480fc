//! Output formats shared by the subcommands, and the macros every command prints its result
//! with: [`out!`] and [`outln!`] return the write's `io::Result` instead of panicking as `print!`
//! does when stdout is a closed pipe (`weft topo show f | head -1`); `main` ends quietly on that.

/// `print!` that returns the write's `io::Result`.
macro_rules! out {
    ($($arg:tt)*) => {
        std::io::Write::write_fmt(&mut std::io::stdout().lock(), format_args!($($arg)*))
    };
}

/// `println!` that returns the write's `io::Result`.
macro_rules! outln {
    () => {
        std::io::Write::write_all(&mut std::io::stdout().lock(), b"\n")
    };
    ($($arg:tt)*) => {{
        let mut stdout = std::io::stdout().lock();
        std::io::Write::write_fmt(&mut stdout, format_args!($($arg)*))
            .and_then(|()| std::io::Write::write_all(&mut stdout, b"\n"))
    }};
}

use clap::ValueEnum;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

/// `--output` for commands that print a result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A readable table.
    #[default]
    Table,
    /// JSON, for scripts.
    Json,
}

/// A table with weft's look.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(header.to_vec());
    // A pseudo-terminal nobody sized (`script`, some CI runners) reports 0 columns: wrapping to that
    // would print one letter per line.
    if t.width().is_some_and(|w| w < 40) {
        t.set_content_arrangement(ContentArrangement::Disabled);
    }
    t
}

/// Columns the simulator's reports fit in: their tables and their prose (docs/simulate.md, "Reading
/// the table"). A terminal that is narrower gets the table wrapped to its width; output that is not a
/// terminal gets it whole.
pub const REPORT_COLUMNS: u16 = 100;

/// A table of a report meant to fit [`REPORT_COLUMNS`]: weft's look, wrapped to the smaller of that and
/// the terminal's width (comfy-table breaks the widest cells first). Header cells may hold a `\n`
/// to take two lines. `right` are the columns aligned right (numbers).
pub fn report_table(header: &[&str], right: &[usize]) -> Table {
    let mut t = table(header);
    if t.width().is_none_or(|w| w > REPORT_COLUMNS) {
        t.set_width(REPORT_COLUMNS).set_content_arrangement(ContentArrangement::Dynamic);
    }
    // The first column names the row (policy, pod, node type): never broken.
    if let Some(col) = t.column_mut(0) {
        col.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
    }
    for &c in right {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t
}

/// `text` wrapped to [`REPORT_COLUMNS`] at spaces, its lines after the first indented by `indent`
/// columns (a word longer than a line stays whole).
pub fn wrap(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let options = textwrap::Options::new(usize::from(REPORT_COLUMNS))
        .subsequent_indent(&pad)
        .break_words(false)
        .word_separator(textwrap::WordSeparator::AsciiSpace)
        .word_splitter(textwrap::WordSplitter::NoHyphenation);
    textwrap::fill(text, options)
}

/// A count with thousands separators, as the progress bars print it: `100,000`.
pub fn count(n: usize) -> String {
    indicatif::HumanCount(n as u64).to_string()
}

/// A non-negative number with `digits` decimals and thousands separators: `1,944.5`.
pub fn count_f(x: f64, digits: usize) -> String {
    let text = format!("{x:.digits$}");
    let (whole, fraction) = text.split_once('.').map_or((text.as_str(), None), |(w, f)| (w, Some(f)));
    match (whole.parse::<usize>(), fraction) {
        (Ok(w), Some(f)) => format!("{}.{f}", count(w)),
        (Ok(w), None) => count(w),
        (Err(_), _) => text,
    }
}

/// Print a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// A GPU list argument: `0,1,4-7` (a newtype, so clap takes it as one value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuList(pub Vec<usize>);

/// Parse a GPU list argument.
pub fn parse_gpu_list_arg(s: &str) -> Result<GpuList, String> {
    parse_gpu_list(s).map(GpuList)
}

/// Parse a GPU list: `0,1,4-7`.
pub fn parse_gpu_list(s: &str) -> Result<Vec<usize>, String> {
    let set = weft_topology::CpuSet::parse_list(s, "GPU")
        .map_err(|e| format!("'{s}' is not a GPU list like 0,1,4-7 ({e})"))?;
    Ok(set.iter().map(|g| g as usize).collect())
}

/// What the node score's affinity term measures of a GPU set (`--set-quality`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SetQualityArg {
    /// The bandwidth of the set's best ring, its slowest hop (what a ring all-reduce gets).
    #[default]
    Ring,
    /// go-gpuallocator's mean pair score (upstream's measure).
    PairScore,
}

/// The node-score settings from the `--remainder-weight` and `--set-quality` flags, checked.
pub fn score_config(remainder_weight: f64, quality: SetQualityArg) -> anyhow::Result<weft_alloc::ScoreConfig> {
    if !(0.0..=1.0).contains(&remainder_weight) {
        anyhow::bail!("--remainder-weight must be between 0 and 1, got {remainder_weight}");
    }
    let set_quality = match quality {
        SetQualityArg::Ring => weft_alloc::SetQuality::Ring,
        SetQualityArg::PairScore => weft_alloc::SetQuality::PairScore,
    };
    Ok(weft_alloc::ScoreConfig { remainder_weight, set_quality })
}
