//! `nacre net selftest` end to end: every phase runs, the last line is JSON with every
//! figure the issue names, the scale phase's simulated clients are all answered; bad
//! options are refused with the reason.

use std::process::Command;

fn nacre(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nacre")).args(args).output().expect("run nacre")
}

#[test]
fn selftest_reports_every_figure_and_answers_every_simulated_client() {
    let out = nacre(&[
        "net",
        "selftest",
        "--seconds",
        "0.2",
        "--bulk-clients",
        "2",
        "--ping-clients",
        "4",
        "--clients",
        "300",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "selftest failed: {}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().last().expect("output");
    let v: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    for key in [
        "bulk_ratio_1m",
        "bulk_ratio_4m",
        "bulk_ratio_16m",
        "read_ratio_1m",
        "read_ratio_4m",
        "read_ratio_16m",
        "ping_ratio",
        "ping_p99_us",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {last}"));
        assert!(x > 0.0, "{key} = {x}");
    }
    assert_eq!(v["clients_connected"], 300);
    assert_eq!(v["unanswered"], 0, "{last}");
    assert_eq!(v["credits_within_bounds"], true);
    let rss = v["server_rss_mib"].as_f64().expect("server_rss_mib");
    assert!(rss > 0.0 && rss < 1024.0, "server RSS {rss} MiB");
    assert!(v["server_pings"].as_u64().unwrap_or(0) > 0, "idle simulated clients ping");
    assert!(stdout.contains("credit low-water marks"));
}

#[test]
fn bad_selftest_options_are_refused_with_the_reason() {
    let cases: [(&[&str], &str); 4] = [
        (&["net", "selftest", "--seconds", "0"], "--seconds"),
        (&["net", "selftest", "--clients", "50000"], "at most 15000"),
        (&["net", "selftest", "--target", "10.0.0.1"], "bad NID"),
        (&["net", "selftest", "--target", "oss@mem", "--seconds", "0.1"], "tcp NIDs"),
    ];
    for (args, want) in cases {
        let out = nacre(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: expected {want:?} in {err}");
    }
}
