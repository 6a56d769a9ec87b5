//! A drift study on two tiny chat models generated here, for the tests of `baton study`.
#![allow(dead_code)]

use super::engine_rig::{tiny, write_pair};
use std::path::Path;

/// Two scripts, two variants, one direction between the tiny models: four items.
pub fn study_in(dir: &Path) {
    write_pair(dir, false);
    std::fs::create_dir_all(dir.join("conversations")).unwrap();
    for (name, seed) in [("one", 3), ("two", 4)] {
        let script = format!(
            "max_tokens = 6\n\n[[step]]\nuser = \"{}\"\n\n[[step]]\nswitch = true\n\n[[step]]\nuser = \"{}\"\nexpect = [\"{}\"]\n",
            tiny().chat_text(30, seed),
            tiny().chat_text(8, seed + 10),
            tiny().chat_text(2, seed + 20),
        );
        std::fs::write(dir.join(format!("conversations/{name}.toml")), script).unwrap();
    }
    let study = format!(
        "name = \"tiny\"\nscripts = [\"conversations\"]\npairs = [[\"{a}\", \"{b}\"]]\ndirections = [\"source-to-target\"]\n\n[variants.map]\nlearn = false\nmapper_dir = \"mappers\"\n\n[variants.tail]\nlearn = false\ntail = 8\nmapper_dir = \"mappers\"\n",
        a = dir.join("a").display(),
        b = dir.join("b").display(),
    );
    std::fs::write(dir.join("study.toml"), study).unwrap();
}
