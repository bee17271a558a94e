//! The hand-written tables of `docs/hostile-input.md` name tests and fuzz targets; each
//! must exist, so the page cannot point at a check that was renamed or removed.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `file.rs::function` in backticks on the page.
fn named_tests(doc: &str) -> Vec<(String, String)> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (file, func) = span.split_once("::")?;
            let ok = file.ends_with(".rs")
                && !file.contains(' ')
                && func.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            ok.then(|| (file.rsplit('/').next().unwrap_or(file).to_string(), func.to_string()))
        })
        .collect()
}

#[test]
fn every_test_the_page_names_exists() {
    let doc = std::fs::read_to_string(root().join("docs/hostile-input.md")).unwrap();
    let named = named_tests(&doc);
    assert!(named.len() >= 10, "the page names only {} tests: {named:?}", named.len());
    for (file, func) in named {
        let path = ["zmq-backend/tests", "tests/tests"]
            .iter()
            .map(|dir| root().join(dir).join(&file))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("docs/hostile-input.md names {file}, which is in no test directory"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&format!("fn {func}(")), "{} has no test {func}", path.display());
    }
}

#[test]
fn every_fuzz_target_the_page_names_exists() {
    let doc = std::fs::read_to_string(root().join("docs/hostile-input.md")).unwrap();
    let fuzzing = doc.split("## Fuzzing").nth(1).expect("the page has a Fuzzing section");
    let targets: Vec<&str> = fuzzing.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next()).collect();
    assert_eq!(targets.len(), 6, "{targets:?}");
    let manifest = std::fs::read_to_string(root().join("fuzz/Cargo.toml")).unwrap();
    for target in targets {
        assert!(root().join(format!("fuzz/fuzz_targets/{target}.rs")).exists(), "no fuzz target {target}");
        assert!(manifest.contains(&format!("name = \"{target}\"")), "{target} is not a bin of fuzz/Cargo.toml");
    }
}

#[test]
fn named_tests_are_read_from_code_spans() {
    let doc = "a `x.rs::f_1` b `not a test` `dir/y.rs::g`, `x.rs::h i`";
    assert_eq!(named_tests(doc), [("x.rs".into(), "f_1".into()), ("y.rs".into(), "g".into())]);
}
