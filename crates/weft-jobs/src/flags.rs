//! Plugin arguments with Go `flag` syntax, as Volcano parses them (`flag.NewFlagSet(name,
//! flag.ContinueOnError)`), in two modes:
//!
//! - [`Mode::Strict`] (weft's plugins): any error rejects the arguments, so admission can refuse
//!   the job with a message naming the plugin and the flag. Positional arguments are errors too.
//! - [`Mode::Lenient`] (Volcano's `spec.plugins`): what Volcano does. Parsing stops at the first
//!   error; flags parsed before it keep their values, the rest keep defaults, and the flag whose
//!   value did not parse holds what Go's `flag` package stores before it returns the error: 0 for
//!   an int that is not a number, the int's limit for one out of range (`strconv.ParseInt`), false
//!   for a bool. The error is returned as a warning instead of being only logged. A positional
//!   argument is no error in Go: parsing stops there silently; the warning says so.
//!
//! Syntax (Go's): `-name=value`, `--name=value`, `-name value`, `--name value`; a bool flag alone
//! means true and takes a value only with `=`; parsing stops at `--` or the first argument that is
//! not a flag. Ints are read like Go's `strconv.ParseInt(s, 0, 64)` (`0x`, `0o`, `0b`, a leading
//! `0` for octal, `_` between digits), bools like `strconv.ParseBool`.
//!
//! Hand-written rather than clap: clap cannot accept single-dash long names (`-port=5000`), Go's
//! base-prefixed ints and bool spellings, or Go's stop-at-first-positional rule, and Volcano users'
//! existing argument lists must keep meaning what they meant.

use std::collections::BTreeMap;
use std::fmt;

/// How to treat errors; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reject on any error (weft's plugins).
    Strict,
    /// Volcano's behaviour: stop at the first error and keep going with what was parsed.
    Lenient,
}

/// The type of a flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `-x` alone is true; `-x=false` sets false.
    Bool,
    /// A 64-bit signed integer.
    Int,
    /// Any string.
    Str,
}

/// One flag a plugin accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagDef {
    /// Name without dashes, e.g. `port`.
    pub name: &'static str,
    /// Value type.
    pub kind: Kind,
    /// Default value, in the flag's own syntax (`"2222"`, `"true"`, `"ps"`).
    pub default: &'static str,
}

impl FlagDef {
    /// A string flag.
    pub const fn string(name: &'static str, default: &'static str) -> Self {
        Self { name, kind: Kind::Str, default }
    }
    /// An integer flag.
    pub const fn int(name: &'static str, default: &'static str) -> Self {
        Self { name, kind: Kind::Int, default }
    }
    /// A bool flag.
    pub const fn bool(name: &'static str, default: &'static str) -> Self {
        Self { name, kind: Kind::Bool, default }
    }
}

/// A parsed value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagValue {
    /// Bool.
    Bool(bool),
    /// Int.
    Int(i64),
    /// String.
    Str(String),
}

/// What was wrong with a plugin's arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A flag the plugin does not define.
    #[error("unknown flag -{flag} (accepted: {accepted})")]
    Unknown {
        /// The flag as written, without dashes.
        flag: String,
        /// The plugin's flags, `-a, -b`.
        accepted: String,
    },
    /// A value that does not parse as the flag's type.
    #[error("flag -{flag}: invalid value {value:?}: expected {expected}")]
    BadValue {
        /// The flag.
        flag: String,
        /// The value as written.
        value: String,
        /// What the flag takes.
        expected: &'static str,
    },
    /// A value the flag's type cannot represent (Go: `strconv.ErrRange`).
    #[error("flag -{flag}: value {value:?} is out of range for a 64-bit integer")]
    OutOfRange {
        /// The flag.
        flag: String,
        /// The value as written.
        value: String,
    },
    /// A non-bool flag at the end with no value.
    #[error("flag -{flag} needs a value")]
    MissingValue {
        /// The flag.
        flag: String,
    },
    /// `---x`, `-=x` and the like.
    #[error("bad flag syntax: {arg}")]
    BadSyntax {
        /// The argument as written.
        arg: String,
    },
    /// An argument that is not a flag. Go's `flag` package stops there without an error, so
    /// Volcano ignores it and everything after it without a word.
    #[error(
        "unexpected argument {arg:?}: plugin arguments are flags only (Volcano silently ignores it and everything after it)"
    )]
    Positional {
        /// The first argument that was not a flag.
        arg: String,
    },
}

impl FlagError {
    /// The flag the error is about, when there is one.
    pub fn flag(&self) -> Option<&str> {
        match self {
            Self::Unknown { flag, .. }
            | Self::BadValue { flag, .. }
            | Self::OutOfRange { flag, .. }
            | Self::MissingValue { flag } => Some(flag),
            Self::BadSyntax { .. } | Self::Positional { .. } => None,
        }
    }
}

/// The values of a plugin's flags after parsing: every defined flag has one (its default when not
/// given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flags {
    values: BTreeMap<&'static str, FlagValue>,
    given: Vec<&'static str>,
}

impl Flags {
    /// The value of string flag `name`. Panics in debug builds if `name` is not a defined string
    /// flag (a programming error in a plugin, not an input error).
    pub fn string(&self, name: &str) -> &str {
        match self.values.get(name) {
            Some(FlagValue::Str(s)) => s,
            other => {
                debug_assert!(false, "flag {name} is not a string flag: {other:?}");
                ""
            }
        }
    }

    /// The value of int flag `name` (see [`Flags::string`] on undefined names).
    pub fn int(&self, name: &str) -> i64 {
        match self.values.get(name) {
            Some(FlagValue::Int(i)) => *i,
            other => {
                debug_assert!(false, "flag {name} is not an int flag: {other:?}");
                0
            }
        }
    }

    /// The value of bool flag `name` (see [`Flags::string`] on undefined names).
    pub fn bool(&self, name: &str) -> bool {
        match self.values.get(name) {
            Some(FlagValue::Bool(b)) => *b,
            other => {
                debug_assert!(false, "flag {name} is not a bool flag: {other:?}");
                false
            }
        }
    }

    /// Whether `name` was given in the arguments (as opposed to holding its default).
    pub fn was_given(&self, name: &str) -> bool {
        self.given.contains(&name)
    }

    /// The value of flag `name` in the flag's own syntax (`0`, `false`, `ps`).
    pub fn display(&self, name: &str) -> String {
        match self.values.get(name) {
            Some(FlagValue::Bool(b)) => b.to_string(),
            Some(FlagValue::Int(i)) => i.to_string(),
            Some(FlagValue::Str(s)) => s.clone(),
            None => String::new(),
        }
    }
}

/// Parses `args` against `defs`. In [`Mode::Strict`] the first error is returned; in
/// [`Mode::Lenient`] the flags are returned with the first error (if any) as a warning.
pub fn parse(defs: &[FlagDef], args: &[String], mode: Mode) -> Result<(Flags, Option<FlagError>), FlagError> {
    let mut flags = Flags { values: BTreeMap::new(), given: Vec::new() };
    for d in defs {
        // Defaults are written by plugin authors; a default that does not parse is a programming
        // error, caught by every plugin's default-arguments test.
        let v = parse_value(d, d.default).unwrap_or(FlagValue::Str(d.default.to_owned()));
        flags.values.insert(d.name, v);
    }
    match parse_into(defs, args, &mut flags) {
        Ok(()) => Ok((flags, None)),
        Err(e) => match mode {
            Mode::Strict => Err(e),
            Mode::Lenient => Ok((flags, Some(e))),
        },
    }
}

fn parse_into(defs: &[FlagDef], args: &[String], flags: &mut Flags) -> Result<(), FlagError> {
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg.len() < 2 || !arg.starts_with('-') {
            return Err(FlagError::Positional { arg: arg.clone() });
        }
        let mut name = &arg[1..];
        if let Some(rest) = name.strip_prefix('-') {
            if rest.is_empty() {
                // `--` ends the flags; Go leaves the rest as positional arguments.
                return match args.get(i) {
                    Some(next) => Err(FlagError::Positional { arg: next.clone() }),
                    None => Ok(()),
                };
            }
            name = rest;
        }
        if name.is_empty() || name.starts_with('-') || name.starts_with('=') {
            return Err(FlagError::BadSyntax { arg: arg.clone() });
        }
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (name, None),
        };
        let Some(def) = defs.iter().find(|d| d.name == name) else {
            let accepted = defs.iter().map(|d| format!("-{}", d.name)).collect::<Vec<_>>().join(", ");
            return Err(FlagError::Unknown { flag: name.to_owned(), accepted });
        };
        let value = match (def.kind, inline) {
            (Kind::Bool, None) => "true",
            (_, Some(v)) => v,
            (_, None) => match args.get(i) {
                Some(v) => {
                    i += 1;
                    v.as_str()
                }
                None => return Err(FlagError::MissingValue { flag: name.to_owned() }),
            },
        };
        let parsed = match def.kind {
            Kind::Str => FlagValue::Str(value.to_owned()),
            Kind::Bool => match parse_go_bool(value) {
                Some(b) => FlagValue::Bool(b),
                None => {
                    // Go's boolValue.Set stores ParseBool's false before returning the error.
                    flags.values.insert(def.name, FlagValue::Bool(false));
                    return Err(bad_value(name, value, "a bool (true, false, 1, 0, t, f)"));
                }
            },
            Kind::Int => match go_parse_int(value) {
                Ok(i) => FlagValue::Int(i),
                Err(GoIntError::Syntax) => {
                    // Go's intValue.Set stores ParseInt's 0 before returning the error.
                    flags.values.insert(def.name, FlagValue::Int(0));
                    return Err(bad_value(name, value, "an integer"));
                }
                Err(GoIntError::Range(limit)) => {
                    // ... and on a range error the limit of the int's size, with the sign.
                    flags.values.insert(def.name, FlagValue::Int(limit));
                    return Err(FlagError::OutOfRange { flag: name.to_owned(), value: value.to_owned() });
                }
            },
        };
        flags.values.insert(def.name, parsed);
        if !flags.given.contains(&def.name) {
            flags.given.push(def.name);
        }
    }
    Ok(())
}

fn bad_value(flag: &str, value: &str, expected: &'static str) -> FlagError {
    FlagError::BadValue { flag: flag.to_owned(), value: value.to_owned(), expected }
}

fn parse_value(def: &FlagDef, value: &str) -> Option<FlagValue> {
    match def.kind {
        Kind::Str => Some(FlagValue::Str(value.to_owned())),
        Kind::Bool => parse_go_bool(value).map(FlagValue::Bool),
        Kind::Int => parse_go_int(value).map(FlagValue::Int),
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Why Go's `strconv.ParseInt` failed, with what it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoIntError {
    /// Not a number (`ErrSyntax`; ParseInt returns 0).
    Syntax,
    /// A number beyond 64 bits (`ErrRange`; ParseInt returns the limit of that sign).
    Range(i64),
}

/// Go's `strconv.ParseInt(s, 0, 64)`: optional sign, base from the prefix (`0x`, `0o`, `0b`, a
/// leading `0` for octal, else decimal), `_` allowed only between digits or after the prefix.
pub fn parse_go_int(s: &str) -> Option<i64> {
    go_parse_int(s).ok()
}

/// [`parse_go_int`] with Go's two failures told apart.
pub fn go_parse_int(s: &str) -> Result<i64, GoIntError> {
    let negative = s.starts_with('-');
    let parsed = parse_go_int_wide(s).ok_or(GoIntError::Syntax)?;
    i64::try_from(parsed).map_err(|_| GoIntError::Range(if negative { i64::MIN } else { i64::MAX }))
}

/// The value of a Go integer literal as [`parse_go_int`] reads it, beyond 64 bits when it is
/// (`None`: not a number, or beyond even 128 bits).
fn parse_go_int_wide(s: &str) -> Option<i128> {
    let (negative, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d, true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d, true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    if !underscores_ok(digits, prefixed) {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if clean.is_empty() || !clean.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // All digits but too many for 128 bits: out of any range, not a syntax error.
    let magnitude = i128::from_str_radix(&clean, radix).unwrap_or(i128::MAX);
    Some(if negative { -magnitude } else { magnitude })
}

/// Go's rule: `_` only between digits, or right after a base prefix.
fn underscores_ok(digits: &str, prefixed: bool) -> bool {
    let b = digits.as_bytes();
    for (i, c) in b.iter().enumerate() {
        if *c == b'_' {
            let prev_ok = if i == 0 { prefixed } else { b[i - 1] != b'_' };
            let next_ok = i + 1 < b.len() && b[i + 1] != b'_';
            if !prev_ok || !next_ok {
                return false;
            }
        }
    }
    true
}

/// The arguments in canonical form (`--name=value` for every given flag, in definition order),
/// for messages and rendered output.
pub fn canonical_args(defs: &[FlagDef], flags: &Flags) -> Vec<String> {
    defs.iter()
        .filter(|d| flags.was_given(d.name))
        .map(|d| match &flags.values[d.name] {
            FlagValue::Bool(b) => format!("--{}={b}", d.name),
            FlagValue::Int(i) => format!("--{}={i}", d.name),
            FlagValue::Str(s) => format!("--{}={s}", d.name),
        })
        .collect()
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Bool => "bool",
            Kind::Int => "int",
            Kind::Str => "string",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFS: &[FlagDef] =
        &[FlagDef::string("ps", "ps"), FlagDef::int("port", "2222"), FlagDef::bool("wait", "false")];

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    fn strict(a: &[&str]) -> Result<Flags, FlagError> {
        parse(DEFS, &args(a), Mode::Strict).map(|(f, w)| {
            assert!(w.is_none());
            f
        })
    }

    #[test]
    fn defaults_when_nothing_given() {
        let f = strict(&[]).expect("parses");
        assert_eq!((f.string("ps"), f.int("port"), f.bool("wait")), ("ps", 2222, false));
        assert!(!f.was_given("port"));
    }

    #[test]
    fn go_forms_of_flags() {
        for form in [&["-port=5000"][..], &["--port=5000"], &["-port", "5000"], &["--port", "5000"]] {
            assert_eq!(strict(form).expect("parses").int("port"), 5000, "{form:?}");
        }
        let f = strict(&["--wait", "--ps", "params"]).expect("parses");
        assert!(f.bool("wait"));
        assert_eq!(f.string("ps"), "params");
        assert!(!strict(&["--wait=false"]).expect("parses").bool("wait"));
        // A non-bool flag takes the next argument even when it looks like a flag (Go does).
        assert_eq!(strict(&["--ps", "-x"]).expect("parses").string("ps"), "-x");
        // `--ps=` sets the empty string.
        assert_eq!(strict(&["--ps="]).expect("parses").string("ps"), "");
    }

    #[test]
    fn bool_flag_never_consumes_the_next_argument() {
        // `--wait false` is `--wait` then a positional `false`: Go stops there.
        assert_eq!(strict(&["--wait", "false"]), Err(FlagError::Positional { arg: "false".into() }));
    }

    #[test]
    fn go_integer_syntax() {
        for (s, v) in [
            ("0x10", 16),
            ("0o17", 15),
            ("017", 15),
            ("0b101", 5),
            ("-12", -12),
            ("+7", 7),
            ("1_000", 1000),
            ("0x_ff", 255),
            ("0", 0),
        ] {
            assert_eq!(parse_go_int(s), Some(v), "{s}");
        }
        for s in ["", "-", "1__0", "_1", "1_", "0x", "08", "1e3", "12abc", "99999999999999999999"] {
            assert_eq!(parse_go_int(s), None, "{s}");
        }
    }

    #[test]
    fn go_bool_syntax() {
        for s in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(s), Some(true));
        }
        for s in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(s), Some(false));
        }
        for s in ["yes", "on", "tRuE", ""] {
            assert_eq!(parse_go_bool(s), None);
        }
    }

    #[test]
    fn strict_errors_name_the_flag() {
        let e = strict(&["--prot=1"]).expect_err("unknown flag");
        assert_eq!(e.flag(), Some("prot"));
        assert_eq!(e.to_string(), "unknown flag -prot (accepted: -ps, -port, -wait)");
        let e = strict(&["--port=abc"]).expect_err("bad value");
        assert_eq!(e.to_string(), "flag -port: invalid value \"abc\": expected an integer");
        assert_eq!(strict(&["--port"]), Err(FlagError::MissingValue { flag: "port".into() }));
        assert_eq!(strict(&["---port=1"]), Err(FlagError::BadSyntax { arg: "---port=1".into() }));
        assert_eq!(strict(&["-=1"]), Err(FlagError::BadSyntax { arg: "-=1".into() }));
        assert_eq!(strict(&["port=1"]), Err(FlagError::Positional { arg: "port=1".into() }));
        assert_eq!(strict(&["--", "x"]), Err(FlagError::Positional { arg: "x".into() }));
        assert!(strict(&["--port=1", "--"]).is_ok());
    }

    #[test]
    fn lenient_keeps_what_go_stores_when_a_value_does_not_parse() {
        let (f, w) = parse(DEFS, &args(&["--ps=params", "--port=abc", "--wait"]), Mode::Lenient).expect("lenient");
        assert_eq!(f.string("ps"), "params", "flags before the error keep their values");
        assert_eq!(f.int("port"), 0, "Go's intValue.Set stores ParseInt's 0 for a value that is not a number");
        assert!(!f.bool("wait"), "flags after the error are not parsed");
        assert!(!f.was_given("port"), "Go does not count a flag whose value failed as set");
        assert_eq!(w.and_then(|e| e.flag().map(str::to_owned)).as_deref(), Some("port"));
        // Out of range: the limit of the sign, as strconv.ParseInt returns with ErrRange.
        let (f, w) = parse(DEFS, &args(&["--port=99999999999999999999"]), Mode::Lenient).expect("lenient");
        assert_eq!(f.int("port"), i64::MAX);
        assert!(matches!(w, Some(FlagError::OutOfRange { .. })), "{w:?}");
        let (f, _) = parse(DEFS, &args(&["--port=-0x8000000000000001"]), Mode::Lenient).expect("lenient");
        assert_eq!(f.int("port"), i64::MIN);
        // A bool that does not parse stores false (ParseBool's value), even over a true default.
        let defs = &[FlagDef::bool("inject", "true")];
        let (f, w) = parse(defs, &args(&["--inject=no"]), Mode::Lenient).expect("lenient");
        assert!(!f.bool("inject"));
        assert!(matches!(w, Some(FlagError::BadValue { .. })), "{w:?}");
    }

    #[test]
    fn a_positional_argument_stops_parsing_silently_in_go() {
        let (f, w) = parse(DEFS, &args(&["--port=5", "oops", "--wait"]), Mode::Lenient).expect("lenient");
        assert_eq!(f.int("port"), 5);
        assert!(!f.bool("wait"));
        let w = w.expect("reported").to_string();
        assert!(w.contains("silently"), "{w}");
    }

    #[test]
    fn last_occurrence_wins_and_canonical_form_lists_given_flags() {
        let f = strict(&["-port=1", "--port", "0x10", "--wait"]).expect("parses");
        assert_eq!(f.int("port"), 16);
        assert_eq!(canonical_args(DEFS, &f), vec!["--port=16".to_owned(), "--wait=true".to_owned()]);
    }
}
