//! Deployment: the shared memory's mode and group for training processes of another user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use serde_json::json;

use crate::common::{TempDir, TestServer, joader, shm_objects, unique_instance};
use crate::server::dataset;

/// `--shm-mode 660 --shm-gid G`: the data segment and every ring are `rw-rw----` and belong to
/// group G (whatever the umask), the instance lock stays the server's alone.
#[test]
fn shm_mode_and_group_apply_to_the_segments_clients_open() {
    // Root may give any group; another user a group it belongs to (its own).
    let gid = if rustix::process::geteuid().is_root() {
        4242
    } else {
        rustix::process::getegid().as_raw()
    };
    let dir = TempDir::new("shmmode");
    let instance = unique_instance("shmmode");
    let root = dataset();
    let gid_arg = gid.to_string();
    let server = TestServer::start(
        &instance,
        &dir.0,
        root,
        &["--shm-mode", "660", "--shm-gid", &gid_arg],
    );
    let c = server.client();
    c.ok(
        "POST",
        "/v1/datasets",
        Some(&json!({"name": "imgs", "source": {"kind": "image_folder", "path": root}})),
    )
    .unwrap();
    c.wait_ready("imgs", crate::common::DEADLINE).unwrap();
    c.ok(
        "POST",
        "/v1/jobs",
        Some(&json!({"name": "j", "dataset": "imgs", "batch_size": 4})),
    )
    .unwrap();
    let objects = shm_objects(&instance);
    assert!(objects.iter().any(|o| o.ends_with("-data")), "{objects:?}");
    assert!(objects.iter().any(|o| o.contains("-ring-")), "{objects:?}");
    for o in &objects {
        let meta = std::fs::metadata(format!("/dev/shm/{o}")).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if o.ends_with("-lock") {
            assert_eq!(mode, 0o600, "{o}");
        } else {
            assert_eq!(mode, 0o660, "{o}");
            assert_eq!(meta.gid(), gid, "{o}");
        }
    }
}

/// A mode with execute bits, or without the owner's read and write, is refused at start-up.
#[test]
fn a_bad_shm_mode_is_refused() {
    for bad in ["755", "060", "9"] {
        let o = joader(&["serve", "--bind", "127.0.0.1:0", "--shm-mode", bad]);
        assert!(!o.status.success(), "--shm-mode {bad} accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("shm") || err.contains("octal"), "{bad}: {err}");
    }
}

/// The shipped binary (`docker/Dockerfile`) is built without the `bench` feature and stripped,
/// and without that feature nothing of the benches' chart library is linked.
#[test]
fn the_shipped_binary_carries_no_bench() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dockerfile = std::fs::read_to_string(root.join("docker/Dockerfile")).unwrap();
    let build = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("the Dockerfile builds with cargo");
    assert!(
        build.contains("--bin joader") && build.contains("--no-default-features"),
        "{build}"
    );
    assert!(
        dockerfile.contains("strip -o /usr/local/bin/joader"),
        "{dockerfile}"
    );
    let tree = |features: &[&str]| {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(&root)
            .args([
                "tree",
                "--offline",
                "-q",
                "-e",
                "normal",
                "-p",
                "joader-tools",
            ])
            .args(features)
            .output()
            .expect("run cargo tree");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(!tree(&["--no-default-features"]).contains("plotters"));
    // The source tree's build (the tests, `cargo run -- bench`) has them.
    assert!(tree(&[]).contains("plotters"));
}
