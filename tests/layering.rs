//! The crate's modules stand in layers, and a module only uses the layers below its own.
//!
//! This test reads every `crate::` path in the code of `src/` and fails on a path that reaches
//! a module of the same layer or of one above, or an item of the crate root (a re-export there
//! would hide which module it comes from). Left out: comments and doc comments (a doc link may
//! point anywhere) and unit-test modules (`#[cfg(test)] mod …`, `src/**/tests/`), which may
//! drive a module from above. Strict layers also rule out circles between modules. A new
//! top-level module must be given a layer here; `docs/ARCHITECTURE.md` draws the same picture.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// From the bottom up. A module may use the modules of the layers before its own.
const LAYERS: &[(&str, &[&str])] = &[
    ("data", &["record"]),
    (
        "vocabulary",
        &["error", "position", "kpl", "telemetry", "jitter"],
    ),
    ("seams", &["api", "lease"]),
    ("reading and settling", &["shard", "ack"]),
    ("composing", &["subscription", "publish", "kcl"]),
    ("faces", &["broker", "guide"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The top-level module a file of `src/` belongs to (`None` outside the library's modules).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        // The crate root, and binaries (whose `crate::` is a crate of their own).
        "lib.rs" | "bin" => None,
        name => Some(name.trim_end_matches(".rs").to_owned()),
    }
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The modules a line of code names through `crate::`, comments left out.
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // `kinesis_dataflow_crate::` or `$crate::` are not this crate's root.
            code[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '$'))
        })
        .flat_map(|(at, _)| {
            let rest = &code[at + "crate::".len()..];
            // `crate::{a::X, b}`: the first segment of each item.
            let items = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            items
                .into_iter()
                .map(|item| {
                    (item.trim_start().chars())
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .filter(|name| !name.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The lines of `text` outside its unit-test modules, with their index.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let mut depth: Option<i64> = None;
    let mut test_attribute = false;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = depth.as_mut() {
            *open += braces(line);
            if *open <= 0 {
                depth = None;
            }
            continue;
        }
        if test_attribute && (trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod "))
        {
            depth = Some(braces(line)).filter(|open| *open > 0);
            test_attribute = false;
            continue;
        }
        test_attribute = trimmed.starts_with("#[cfg(test)]");
        lines.push((number, line));
    }
    lines
}

/// Opening minus closing braces on a line of code (comments left out).
fn braces(line: &str) -> i64 {
    let code = line.split("//").next().unwrap_or("");
    code.chars()
        .map(|c| match c {
            '{' => 1,
            '}' => -1,
            _ => 0,
        })
        .sum()
}

/// Every use of a module at or above the user's own layer, as `file:line: what`.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let Some(module) = module_of(src, &file) else {
            continue;
        };
        let Some(own) = layer_of(&module) else {
            found.push(format!(
                "{}: module `{module}` has no layer: add it to LAYERS in tests/layering.rs",
                file.display()
            ));
            continue;
        };
        if file.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        for (number, line) in code_lines(&text) {
            for used in crate_paths(line) {
                if used == module {
                    continue;
                }
                match layer_of(&used) {
                    Some(layer) if layer < own => {}
                    Some(layer) => found.push(format!(
                        "{}:{}: `{module}` ({}) uses `crate::{used}` ({}), which is not below it",
                        file.display(),
                        number + 1,
                        LAYERS[own].0,
                        LAYERS[layer].0
                    )),
                    None if used.starts_with(char::is_uppercase) => found.push(format!(
                        "{}:{}: `crate::{used}` is a re-export of the crate root: name its module",
                        file.display(),
                        number + 1
                    )),
                    None => found.push(format!(
                        "{}:{}: `crate::{used}` is not a module with a layer",
                        file.display(),
                        number + 1
                    )),
                }
            }
        }
    }
    found
}

#[test]
fn no_module_uses_one_at_or_above_its_own_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(
        found.is_empty(),
        "{} imports run sideways or up:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn every_module_of_the_crate_root_has_a_layer() {
    let lib = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|line| {
            let line = line.trim().strip_suffix(';')?;
            let name = line.rsplit(' ').next()?;
            line.split_whitespace()
                .any(|word| word == "mod")
                .then_some(name)
        })
        .collect();
    assert!(declared.contains("record"), "read the modules of lib.rs");
    let missing: Vec<_> = declared
        .iter()
        .filter(|module| layer_of(module).is_none())
        .collect();
    assert!(missing.is_empty(), "modules without a layer: {missing:?}");
}

#[test]
fn unit_test_modules_are_left_out_and_the_code_after_them_is_read() {
    let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() {}\n}\nuse crate::c;\n";
    let read: Vec<usize> = code_lines(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(read, [0, 1, 6]);
    let attribute_on_a_function = "#[cfg(test)]\nfn f() { crate::x(); }\n";
    assert_eq!(code_lines(attribute_on_a_function).len(), 2);
}

#[test]
fn the_reader_of_paths_sees_code_and_skips_comments() {
    assert_eq!(
        crate_paths("use crate::api::{KinesisApi}; // crate::broker"),
        ["api"]
    );
    assert_eq!(
        crate_paths("    /// see [`crate::broker`]"),
        Vec::<String>::new()
    );
    assert_eq!(
        crate_paths("let x = crate::lease::LeaseError::x(crate::error::E);"),
        ["lease", "error"]
    );
    assert_eq!(crate_paths("$crate::ack::x"), Vec::<String>::new());
    assert_eq!(
        crate_paths("use crate::{api::KinesisApi, lease, Record};"),
        ["api", "lease", "Record"]
    );
}
