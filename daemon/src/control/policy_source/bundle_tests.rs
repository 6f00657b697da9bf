use std::io::Write;

use super::*;
use crate::policy::LocalMode;

const MANIFEST_TEXT: &str =
    "revision = 3\ncreated_at = \"2026-12-07T00:00:00Z\"\nlocal = \"merge\"\n";
const MAX: u64 = 1024 * 1024;

/// One raw tar entry: any name (no checks), any type.
struct Raw<'a> {
    name: &'a [u8],
    kind: tar::EntryType,
    data: &'a [u8],
    link: Option<&'a str>,
}

fn file<'a>(name: &'a str, data: &'a str) -> Raw<'a> {
    Raw {
        name: name.as_bytes(),
        kind: tar::EntryType::Regular,
        data: data.as_bytes(),
        link: None,
    }
}

fn gz(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..e.name.len()].copy_from_slice(e.name);
        h.set_entry_type(e.kind);
        h.set_size(e.data.len() as u64);
        h.set_mode(0o644);
        if let Some(target) = e.link {
            h.set_link_name(target).expect("link name");
        }
        h.set_cksum();
        tar.append(&h, e.data).expect("append");
    }
    let tar = tar.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("gzip")
}

#[test]
fn reads_files_in_directory_load_order() {
    let b = gz(&[
        file("./custom/z.json", "{}"),
        file("./b.toml", "# b"),
        file("./manifest.toml", MANIFEST_TEXT),
        file("./a.json", "{}"),
        file("./a.toml", "# a"),
    ]);
    let bundle = Bundle::read(&b, MAX).expect("a bundle");
    let names: Vec<&str> = bundle.files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a.toml", "b.toml", "a.json", "custom/z.json"]);
    assert_eq!(bundle.manifest.revision, 3);
    assert_eq!(bundle.sources()[0].name, "bundle:r3/a.toml");
}

#[test]
fn write_then_read_round_trips() {
    let bundle = Bundle {
        manifest: Manifest {
            revision: 9,
            created_at: "2026-12-07T00:00:00Z".into(),
            local: LocalMode::Ignore,
        },
        files: vec![("main.toml".into(), "default = \"deny\"\n".into())],
    };
    let mut out = Vec::new();
    bundle.write(&mut out).expect("write");
    let again = Bundle::read(&out, MAX).expect("read");
    assert_eq!(again.manifest, bundle.manifest);
    assert_eq!(again.files, bundle.files);
    let mut twice = Vec::new();
    bundle.write(&mut twice).expect("write");
    assert_eq!(out, twice, "the same input gives the same bytes");
}

#[test]
fn path_traversal_is_refused() {
    for name in ["../evil.toml", "/etc/evil.toml", "custom/../../x.toml"] {
        let b = gz(&[file("manifest.toml", MANIFEST_TEXT), file(name, "# x")]);
        assert!(
            matches!(Bundle::read(&b, MAX), Err(BundleError::Path(_))),
            "{name}"
        );
    }
}

#[test]
fn links_and_special_files_are_refused() {
    for (kind, link) in [
        (tar::EntryType::Symlink, Some("/etc/passwd")),
        (tar::EntryType::Link, Some("manifest.toml")),
        (tar::EntryType::Char, None),
        (tar::EntryType::Fifo, None),
    ] {
        let b = gz(&[
            file("manifest.toml", MANIFEST_TEXT),
            Raw {
                name: b"x.toml",
                kind,
                data: b"",
                link,
            },
        ]);
        assert!(
            matches!(Bundle::read(&b, MAX), Err(BundleError::NotAFile { .. })),
            "{kind:?}"
        );
    }
}

#[test]
fn oversize_is_refused_while_unpacking() {
    let big = "#".repeat(64 * 1024);
    let b = gz(&[file("manifest.toml", MANIFEST_TEXT), file("big.toml", &big)]);
    assert!(b.len() < 4096, "compresses well: a bomb in small");
    assert!(matches!(
        Bundle::read(&b, 16 * 1024),
        Err(BundleError::TooLarge(_))
    ));
    assert!(Bundle::read(&b, MAX).is_ok());
}

#[test]
fn missing_manifest_and_foreign_files_are_refused() {
    let b = gz(&[file("main.toml", "# x")]);
    assert!(matches!(
        Bundle::read(&b, MAX),
        Err(BundleError::NoManifest)
    ));
    for name in ["run.sh", "sub/x.toml", ".hidden.toml", "custom/x.toml"] {
        let b = gz(&[file("manifest.toml", MANIFEST_TEXT), file(name, "# x")]);
        assert!(
            matches!(Bundle::read(&b, MAX), Err(BundleError::NotPolicy(_))),
            "{name}"
        );
    }
    let b = gz(&[
        file("manifest.toml", MANIFEST_TEXT),
        file("a.toml", "# 1"),
        file("./a.toml", "# 2"),
    ]);
    assert!(matches!(
        Bundle::read(&b, MAX),
        Err(BundleError::Duplicate(_))
    ));
    let b = gz(&[file("manifest.toml", "revision = 1\n")]);
    assert!(matches!(
        Bundle::read(&b, MAX),
        Err(BundleError::Manifest(_))
    ));
}

#[test]
fn garbage_is_not_a_bundle() {
    assert!(matches!(
        Bundle::read(b"not gzip at all", MAX),
        Err(BundleError::Gzip(_))
    ));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&[0xff; 1024]).expect("gzip");
    let b = gz.finish().expect("gzip");
    assert!(Bundle::read(&b, MAX).is_err());
}

/// TOML integers are i64: a revision above that cannot be written (and no daemon could
/// read it); `agenshield proxy policy bundle --revision` gets an error, not a panic.
#[test]
fn a_revision_toml_cannot_hold_is_an_error_not_a_panic() {
    let b = Bundle {
        manifest: Manifest {
            revision: u64::MAX,
            created_at: "2026-12-07T00:00:00Z".into(),
            local: LocalMode::Merge,
        },
        files: vec![("a.toml".into(), "version = 1\n".into())],
    };
    let got = std::panic::catch_unwind(|| b.write(Vec::new()));
    assert!(matches!(got, Ok(Err(BundleError::Manifest(_)))), "{got:?}");
}
