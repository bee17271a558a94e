//! The facts the docs state about the code, read from the code: every constant a page
//! names with its value (`` `faults::POLL_INTERVAL` (50 ms) ``, or a table row
//! `` | `ec::slab::ALIGNMENT` | 256 | ``) must have that value, and the simulator's oracle
//! tables must name exactly the oracles the code fires. A page that goes stale fails here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ctlplane_core::ec::{defaults as ec_defaults, producer, readiness, reservations, shard, slab, topology, wire};
use ctlplane_core::p2p::{defaults as p2p_defaults, messages, registry, session};
use ctlplane_core::regressions;
use ctlplane_sim::{engine, faults, p2p, scenario};

/// A value as a page writes it.
#[derive(Clone, Debug, PartialEq)]
enum Fact {
    Millis(u128),
    Count(u128),
    Text(String),
}

fn dur(d: Duration) -> Fact {
    Fact::Millis(d.as_millis())
}

fn count(n: impl Into<u128>) -> Fact {
    Fact::Count(n.into())
}

/// Every constant a page may name with a value, as the code has it.
fn known() -> Vec<(&'static str, Fact)> {
    vec![
        ("ec::shard::MAX_PENDING_EVENTS", count(shard::MAX_PENDING_EVENTS as u64)),
        ("ec::shard::REAP_INTERVAL", dur(shard::REAP_INTERVAL)),
        ("ec::defaults::CONTROL_TIMEOUT", dur(ec_defaults::CONTROL_TIMEOUT)),
        ("ec::defaults::REP_RECV_TIMEOUT", dur(ec_defaults::REP_RECV_TIMEOUT)),
        ("ec::defaults::RESERVATION_TTL", dur(ec_defaults::RESERVATION_TTL)),
        ("ec::reservations::TOMBSTONE_LIMIT", count(reservations::TOMBSTONE_LIMIT as u64)),
        ("ec::slab::ALIGNMENT", count(slab::ALIGNMENT)),
        ("ec::producer::RESERVATION_REFRESH", dur(producer::RESERVATION_REFRESH)),
        ("ec::producer::CANCEL_ATTEMPTS", count(producer::CANCEL_ATTEMPTS)),
        ("ec::topology::DISCOVERY_ATTEMPTS", count(topology::DISCOVERY_ATTEMPTS)),
        ("ec::defaults::PUSH_WAIT_TIMEOUT", dur(ec_defaults::PUSH_WAIT_TIMEOUT)),
        ("ec::readiness::MAX_PARTIAL", count(readiness::MAX_PARTIAL as u64)),
        ("ec::readiness::MAX_TERMINAL", count(readiness::MAX_TERMINAL as u64)),
        ("ec::defaults::RECORD_TTL", dur(ec_defaults::RECORD_TTL)),
        ("ec::wire::DEFAULT_MAX_BATCH_ITEMS", count(wire::DEFAULT_MAX_BATCH_ITEMS as u64)),
        ("p2p::defaults::HANDSHAKE_TIMEOUT", dur(p2p_defaults::HANDSHAKE_TIMEOUT)),
        ("p2p::defaults::HEARTBEAT_IVL", dur(p2p_defaults::HEARTBEAT_IVL)),
        ("p2p::defaults::HEARTBEAT_TIMEOUT", dur(p2p_defaults::HEARTBEAT_TIMEOUT)),
        ("p2p::defaults::HEARTBEAT_TTL", dur(p2p_defaults::HEARTBEAT_TTL)),
        ("p2p::session::MAX_CONSECUTIVE_DISPATCH_ERRORS", count(session::MAX_CONSECUTIVE_DISPATCH_ERRORS)),
        ("p2p::registry::MAX_CONTROL_MESSAGE_BYTES", count(registry::MAX_CONTROL_MESSAGE_BYTES as u64)),
        ("p2p::messages::TYPE_KEY", Fact::Text(messages::TYPE_KEY.to_string())),
        ("regressions::S11_GRACE", dur(regressions::S11_GRACE)),
        (
            "regressions::S2_REAP_FAULT_AT",
            Fact::Millis(u128::from(regressions::S2_REAP_FAULT_AT.as_nanos()) / 1_000_000),
        ),
        ("faults::POLL_INTERVAL", dur(faults::POLL_INTERVAL)),
        ("engine::ACTIVE", dur(engine::ACTIVE)),
        ("engine::END", dur(engine::END)),
        ("engine::COALESCE", dur(engine::COALESCE)),
        ("engine::COALESCE_QUIET", dur(engine::COALESCE_QUIET)),
        ("engine::LINK_LATENCY", dur(engine::LINK_LATENCY)),
        ("engine::P2P_CHECK_AT", dur(engine::P2P_CHECK_AT)),
        ("p2p::QUIET_PERIOD", dur(p2p::QUIET_PERIOD)),
        ("scenario::EC_S4_MAX_PENDING_EVENTS", count(scenario::EC_S4_MAX_PENDING_EVENTS as u64)),
    ]
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every page of docs/.
fn pages() -> Vec<(String, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(root()).unwrap_or(&p).display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// A code span that names a constant: `module::path::UPPER_CASE`.
fn is_constant_name(span: &str) -> bool {
    let Some((path, name)) = span.rsplit_once("::") else { return false };
    !path.is_empty()
        && path.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The value written right after a name: ` (50 ms`, `, 20 s`, ` | 4096 |`, ` | `type` |`.
fn value_after(rest: &str) -> Option<Fact> {
    let rest = rest.trim_start();
    let rest = rest.strip_prefix('(').or_else(|| rest.strip_prefix(',')).or_else(|| rest.strip_prefix('|'))?;
    let rest = rest.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '_').collect();
    let n: u128 = digits.chars().filter(char::is_ascii_digit).collect::<String>().parse().ok()?;
    let after = rest[digits.len()..].trim_start();
    let unit: String = after.chars().take_while(char::is_ascii_alphabetic).collect();
    Some(match unit.as_str() {
        "ms" => Fact::Millis(n),
        "s" => Fact::Millis(n * 1000),
        "min" => Fact::Millis(n * 60_000),
        _ => Fact::Count(n),
    })
}

/// Every (constant name, value written after it) on a page.
fn stated(doc: &str) -> Vec<(String, Option<Fact>)> {
    // Code spans are the odd parts.
    let parts: Vec<&str> = doc.split('`').collect();
    let mut out = Vec::new();
    for i in (1..parts.len()).step_by(2) {
        if !is_constant_name(parts[i]) {
            continue;
        }
        let after = parts.get(i + 1).copied().unwrap_or("");
        let value = match (after.trim(), parts.get(i + 2)) {
            ("|" | "(" | ",", Some(span)) if i + 2 < parts.len() - 1 => Some(Fact::Text(span.to_string())),
            _ => value_after(after),
        };
        out.push((parts[i].to_string(), value));
    }
    out
}

#[test]
fn every_constant_a_page_states_has_that_value_in_the_code() {
    let known = known();
    let mut checked = 0;
    let mut mentioned = std::collections::BTreeSet::new();
    for (page, doc) in pages() {
        for (name, value) in stated(&doc) {
            let Some(value) = value else { continue };
            let Some((_, truth)) = known.iter().find(|(k, _)| *k == name) else {
                panic!("{page} states `{name}` = {value:?}, which this test does not know: add it to `known()`");
            };
            assert_eq!(&value, truth, "{page} states `{name}` = {value:?}; the code has {truth:?}");
            mentioned.insert(name);
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} stated constants found: is the parser still reading the pages?");
    for (name, _) in &known {
        assert!(mentioned.contains(*name) || UNSTATED.contains(name), "no page states `{name}` with its value");
    }
}

/// Constants the table knows but no page gives with a value yet.
const UNSTATED: &[&str] = &["engine::END", "engine::COALESCE_QUIET", "engine::LINK_LATENCY", "engine::P2P_CHECK_AT"];

#[test]
fn values_are_read_after_names() {
    assert_eq!(
        stated("a `faults::POLL_INTERVAL` (50 ms) b"),
        [("faults::POLL_INTERVAL".into(), Some(Fact::Millis(50)))]
    );
    assert_eq!(stated("`engine::ACTIVE`, 20 s): x"), [("engine::ACTIVE".into(), Some(Fact::Millis(20_000)))]);
    assert_eq!(stated("| `ec::slab::ALIGNMENT` | 256 | x |"), [("ec::slab::ALIGNMENT".into(), Some(Fact::Count(256)))]);
    assert_eq!(
        stated("`a::B`\n(4,096) and `c::D` and"),
        [("a::B".into(), Some(Fact::Count(4096))), ("c::D".into(), None)]
    );
    assert_eq!(
        stated("| `p2p::messages::TYPE_KEY` | `type` |"),
        [("p2p::messages::TYPE_KEY".into(), Some(Fact::Text("type".into())))]
    );
    assert_eq!(stated("`Knobs::push_wait_timeout` (60 s)"), []);
}

/// The oracle names a table of docs/simulator.md's "Oracles" section lists.
fn documented_oracles() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/simulator.md")).unwrap();
    let section = doc.split("## Oracles").nth(1).expect("docs/simulator.md has an Oracles section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(str::to_string)).collect()
}

/// The oracle names the simulator fires: string literals passed to `violate`/`violate_at`
/// or listed as oracles, gathered from the sources, plus the race catalogue's.
fn fired_oracles() -> std::collections::BTreeSet<String> {
    let mut names: std::collections::BTreeSet<String> =
        regressions::RACES.iter().flat_map(|r| r.oracles.iter().map(|o| o.to_string())).collect();
    let mut stack = vec![root().join("sim/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let mut rest = text.as_str();
            while let Some(at) = rest.find("violate") {
                rest = &rest[at..];
                let call = rest.split(';').next().unwrap_or("");
                if let Some(name) = call.split('"').nth(1) {
                    if !name.is_empty()
                        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    {
                        names.insert(name.to_string());
                    }
                }
                rest = &rest["violate".len()..];
            }
            // An oracle named once in a constant its calls pass.
            for line in text.lines().filter(|l| l.trim_start().starts_with("const ORACLE: &str = ")) {
                if let Some(name) = line.split('"').nth(1) {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

#[test]
fn the_oracle_tables_list_exactly_the_oracles_the_simulator_fires() {
    let documented = documented_oracles();
    let fired = fired_oracles();
    assert!(fired.len() >= 10, "only {} oracles found in the sources: {fired:?}", fired.len());
    for name in &documented {
        assert!(fired.contains(name), "docs/simulator.md lists oracle `{name}`, which the simulator never fires");
    }
    for name in &fired {
        assert!(documented.contains(name), "the simulator fires `{name}`, which docs/simulator.md does not list");
    }
}

/// The workspace's own text files: docs, README and the sources and tests of every crate.
fn own_files() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    let mut stack: Vec<PathBuf> =
        ["docs", "core", "sim", "zmq-backend", "tests", "fuzz/src", "fuzz/fuzz_targets", "scripts", ".ci"]
            .iter()
            .map(|d| root().join(d))
            .collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| ["rs", "md", "py", "sh", "toml"].iter().any(|x| e == *x))
                || path.ends_with(".ci/run")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Section numbers and races cited after each `ec-behaviour.md` / `p2p-behaviour.md`:
/// (page, "§3.4" or "S24").
fn citations(text: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for page in ["ec-behaviour.md", "p2p-behaviour.md"] {
        for (at, _) in text.match_indices(page) {
            let mut rest = &text[at + page.len()..];
            loop {
                let trimmed = rest.trim_start_matches([' ', ',', '/', '-', '–', ';']);
                let trimmed = trimmed.strip_prefix("and ").unwrap_or(trimmed);
                let (token, kind) = if let Some(r) = trimmed.strip_prefix('§') {
                    (r, '§')
                } else if let Some(r) = trimmed.strip_prefix('S') {
                    (r, 'S')
                } else if rest.trim_start().starts_with('-') && trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                    (trimmed, '§')
                } else {
                    break;
                };
                let len = token
                    .char_indices()
                    .take_while(|(i, c)| {
                        c.is_ascii_digit() || (*c == '.' && token[i + 1..].starts_with(|d: char| d.is_ascii_digit()))
                    })
                    .count();
                if len == 0 {
                    break;
                }
                out.push((page, format!("{kind}{}", &token[..len])));
                rest = &token[len..];
            }
        }
    }
    out
}

/// Whether `page` has the section or race `cited`: a heading `## 3.` / `### 3.4 ...`, or a
/// race entry `**S24 ...`.
fn page_has(page: &str, cited: &str) -> bool {
    if let Some(n) = cited.strip_prefix('§') {
        page.lines().any(|l| {
            let title = l.trim_start_matches('#');
            l.starts_with('#')
                && (title.trim_start().starts_with(&format!("{n} "))
                    || title.trim_start().starts_with(&format!("{n}. ")))
        })
    } else {
        page.contains(&format!("**{cited} "))
    }
}

#[test]
fn every_cited_section_and_race_exists() {
    let pages: Vec<(&str, String)> = ["ec-behaviour.md", "p2p-behaviour.md"]
        .iter()
        .map(|p| (*p, std::fs::read_to_string(root().join("docs").join(p)).unwrap()))
        .collect();
    let mut checked = 0;
    for file in own_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (page, cited) in citations(&text) {
            let body = &pages.iter().find(|(p, _)| *p == page).unwrap().1;
            assert!(
                page_has(body, &cited),
                "{} cites {page} {cited}, which has no such section or race",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 50, "only {checked} citations found");
}

#[test]
fn citations_are_read_after_page_names() {
    let cited = citations("(ec-behaviour.md §2.1-2.4, S1) and p2p-behaviour.md §1.7-1.10 and §5, S1-S4; x");
    let want = [("ec-behaviour.md", "§2.1"), ("ec-behaviour.md", "§2.4"), ("ec-behaviour.md", "S1")];
    assert_eq!(cited[..3], want.map(|(p, c)| (p, c.to_string())));
    let p2p: Vec<String> = cited[3..].iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(p2p, ["§1.7", "§1.10", "§5", "S1", "S4"]);
    assert!(page_has("## 3. Lifecycle\n### 3.4 `complete`\n- **S24 Ids**", "§3.4"));
    assert!(page_has("## 3. Lifecycle", "§3"));
    assert!(page_has("- **S24 Ids**", "S24"));
    assert!(!page_has("### 3.4 x", "§3.5"));
}

#[test]
fn nothing_cites_a_file_outside_the_repository() {
    let outside = ["../shared", "/work/", "ec-control.md", "p2p-transport.md", "vllm-0.33-delta", "ARCHITECTURE.md"];
    for file in own_files() {
        if file.ends_with("sim/tests/docs_facts.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for needle in outside {
            assert!(!text.contains(needle), "{} mentions {needle}, which is outside the repository", file.display());
        }
        let cites = text.match_indices("spec ").chain(text.match_indices("Spec "));
        for (i, _) in cites {
            let before = text[..i].chars().last();
            let after = &text[i + 5..];
            let numbered = after.starts_with(|c: char| c.is_ascii_digit() || c == '§')
                || (after.starts_with('S') && after[1..].starts_with(|c: char| c.is_ascii_digit()))
                || ["p2p ", "P2P ", "ec ", "EC "].iter().any(|q| after.starts_with(q));
            let word = before.is_none_or(|c| !c.is_alphanumeric());
            assert!(
                !(word && numbered),
                "{} cites a spec section outside the repository near byte {i}",
                file.display()
            );
        }
    }
}
