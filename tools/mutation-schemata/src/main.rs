//! Writes many mutants of cargo-mutants' listing into one copy of the source, each behind a
//! runtime switch, so the mutation job (scripts/mutation.sh) builds core and the simulator
//! once for all of them instead of once per mutant.
//!
//! A mutant with id N runs when the process has `CTLPLANE_MUTANT=N`; with no mutant named
//! the rewritten code does what the original does. Each mutation is rewritten where it
//! applies, as a branch on the switch:
//!
//! - a function's replaced value: `if on(N) { return VALUE; }` ahead of the body;
//! - a replaced binary operator: `(if on(N) { (L) NEW (R) } else { (L) OLD (R) })`;
//! - a deleted unary operator: `(if on(N) { (E) } else { OP (E) })`;
//! - a deleted match arm: the guard `if !on(N) && (GUARD)`, so its values fall to the arms
//!   below it as they would with the arm gone;
//! - a replaced match guard: `if (if on(N) { VALUE } else { (GUARD) })`.
//!
//! A mutant it cannot place this way (a struct field deleted from a literal, a function
//! returning `impl Trait`, a span it does not find) is reported unplaced: the job runs it
//! the classic way.
//!
//!   mutation-schemata LISTED.json IDS SRC OUT
//!
//! LISTED.json is `cargo mutants --list --json`; IDS the mutants to place, by their index in
//! it, comma-separated; SRC the checkout the listing was made from; OUT the copy to write
//! the rewritten files into (core/src/lib.rs gets the switch). Prints one JSON object:
//! `{"placed": [ids], "unplaced": [ids]}`.

mod rewrite;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Deserialize;
use thiserror::Error;

use rewrite::{Mutation, Pos};

#[derive(Debug, Error)]
enum Error {
    #[error("usage: mutation-schemata LISTED.json IDS SRC OUT")]
    Usage,
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not cargo-mutants' --list --json output: {source}")]
    Listing { path: PathBuf, source: serde_json::Error },
    #[error("mutant id '{0}' is not an index into the listing")]
    Id(String),
    #[error("{path}: does not parse as Rust: {source}")]
    Parse { path: PathBuf, source: syn::Error },
}

/// One mutant of cargo-mutants' listing, the fields the rewrite needs.
#[derive(Debug, Deserialize)]
struct Listed {
    file: String,
    genre: String,
    replacement: String,
    span: Span,
    function: Option<Function>,
}

#[derive(Debug, Deserialize)]
struct Function {
    return_type: String,
}

#[derive(Debug, Deserialize)]
struct Span {
    start: LineColumn,
}

#[derive(Debug, Deserialize)]
struct LineColumn {
    line: usize,
    column: usize,
}

/// The runtime switch, appended to core's lib.rs in the copy.
const SWITCH: &str = r#"
/// The mutation job's switch: the mutant named by `CTLPLANE_MUTANT` is on.
#[doc(hidden)]
pub fn __mutant_on(id: u32) -> bool {
    static ACTIVE: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *ACTIVE.get_or_init(|| std::env::var("CTLPLANE_MUTANT").ok().and_then(|v| v.parse().ok())) == Some(id)
}
"#;

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_owned(), source })
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|source| Error::Io { path: path.to_owned(), source })
}

/// What one mutant becomes in the rewrite, or `None` when it cannot be placed.
fn mutation(id: u32, m: &Listed) -> Option<(String, Mutation)> {
    // cargo-mutants counts columns from 1, proc-macro2 from 0.
    let at = Pos { line: m.span.start.line, column: m.span.start.column.checked_sub(1)? };
    let mutation = match m.genre.as_str() {
        "FnValue" => {
            // Two concrete types behind one `impl Trait` do not compile.
            if m.function.as_ref().is_some_and(|f| f.return_type.contains("impl ")) {
                return None;
            }
            Mutation::Value { id, at, value: m.replacement.clone() }
        }
        "BinaryOperator" => Mutation::Binary { id, at, op: m.replacement.clone() },
        "UnaryOperator" => Mutation::Unary { id, at },
        "MatchArm" => Mutation::Arm { id, at },
        "MatchArmGuard" => Mutation::Guard { id, at, value: m.replacement.clone() },
        _ => return None,
    };
    Some((m.file.clone(), mutation))
}

fn run(args: &[String]) -> Result<String, Error> {
    let [listed, ids, src, out] = args else { return Err(Error::Usage) };
    let listed_path = PathBuf::from(listed);
    let listing: Vec<Listed> = serde_json::from_str(&read(&listed_path)?)
        .map_err(|source| Error::Listing { path: listed_path.clone(), source })?;
    let mut by_file: BTreeMap<String, Vec<Mutation>> = BTreeMap::new();
    let mut unplaced = Vec::new();
    for id in ids.split(',').filter(|s| !s.is_empty()) {
        let n: u32 = id.parse().map_err(|_| Error::Id(id.to_owned()))?;
        let m = listing.get(n as usize).ok_or_else(|| Error::Id(id.to_owned()))?;
        match mutation(n, m) {
            Some((file, mutation)) => by_file.entry(file).or_default().push(mutation),
            None => unplaced.push(n),
        }
    }
    let (src, out) = (Path::new(src), Path::new(out));
    let mut placed = Vec::new();
    for (file, mutations) in &by_file {
        let path = src.join(file);
        let text = read(&path)?;
        let (rewritten, done) =
            rewrite::rewrite(&text, mutations).map_err(|source| Error::Parse { path: path.clone(), source })?;
        for m in mutations {
            if done.contains(&m.id()) {
                placed.push(m.id());
            } else {
                unplaced.push(m.id());
            }
        }
        write(&out.join(file), &rewritten)?;
    }
    let lib = read(&src.join("core/src/lib.rs"))?;
    write(&out.join("core/src/lib.rs"), &format!("{lib}{SWITCH}"))?;
    placed.sort_unstable();
    unplaced.sort_unstable();
    Ok(serde_json::json!({ "placed": placed, "unplaced": unplaced }).to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mutation-schemata: {e}");
            ExitCode::FAILURE
        }
    }
}
