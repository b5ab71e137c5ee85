//! Compiles the project's scripts in: every `.js`/`.mjs` file under
//! `$SLUICE_JS_PROJECT` (but `node_modules/`, `target/` and dot-files)
//! becomes an entry of `FILES`, by its path relative to the project.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_JS_PROJECT");
    // A hash of the project's files, from `sluice plugin build`: a file added
    // or removed changes it (watching the project directory would also watch
    // its `target/`, which this build writes).
    println!("cargo:rerun-if-env-changed=SLUICE_JS_INPUTS");
    let Some(project) = std::env::var_os("SLUICE_JS_PROJECT").map(PathBuf::from) else {
        panic!("SLUICE_JS_PROJECT is not set: `sluice plugin build` sets it to the JS project");
    };
    let mut files = Vec::new();
    collect(&project, &project, &mut files);
    files.sort();
    let mut out = String::from("/// The project's scripts: (path, source).\n");
    out.push_str("pub static FILES: &[(&str, &[u8])] = &[\n");
    for (rel, path) in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        out.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("scripts.rs");
    std::fs::write(&dest, out).expect("writing scripts.rs");
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "node_modules" || name == "target" {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, out);
        } else if name.ends_with(".js") || name.ends_with(".mjs") {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push((rel.to_string_lossy().replace('\\', "/"), path));
        }
    }
}
