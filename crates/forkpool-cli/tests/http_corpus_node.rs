//! forkpool-node (clients/node) against the shared HTTP corpus
//! (tests/http-corpus, rules in docs/http.md), serving the echo app
//! `clients/tests/echo_app.js` in the pool's default mode.
//!
//! Node parses HTTP itself (llhttp), and forkpool-node serves what Node
//! hands it, so where Node's parser departs from docs/http.md the case is
//! listed in [`DEVIATIONS`] with the reason: every other case must pass,
//! and every listed one must still deviate, or the list is out of date.
//! clients/node/README.md shows the same list.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::DemoPool;

const CHUNK_EXTENSIONS: &str = "llhttp checks chunk extensions its own way: it refuses \
     whitespace around `;` and `=`, and accepts empty, nameless and unbounded ones";
const CHUNK_SIZES: &str = "llhttp reads chunk sizes of any length and up to 2^64-1, \
     then waits for that much body";
const CONTENT_LENGTH_REPEATED: &str = "llhttp refuses a repeated Content-Length (400) even \
     when the values are equal";
const HOST_UNCHECKED: &str = "Node does not check Host: repeated, listed or \
     malformed, it reaches the app (the first one, if repeated)";
const ABSOLUTE_HOST: &str = "Node does not replace Host with the authority of an \
     absolute-form target";
const ABSOLUTE_UNCHECKED: &str = "Node does not check an absolute-form target's scheme \
     or authority";
const HEAD_LIMIT: &str = "Node's limit is the whole head (16 KiB, --max-http-header-size), \
     not 8190 bytes a line or 100 lines";
const HEAD_RESET: &str = "Node answers 431 and closes at once while the client is still \
     sending: the reset cuts the answer short";
const AFTER_CLOSE: &str = "llhttp refuses bytes after a message that ends the connection \
     (400, before the first response)";
const METHODS: &str = "llhttp knows a fixed list of methods: any other is 400";
const REQUEST_LINE: &str = "llhttp's request line is lenient: extra spaces, a bare LF \
     before it and a missing version are accepted";
const TARGET_UNCHECKED: &str = "Node does not check the target: `*` with GET and bad \
     percent escapes reach the app";
const FRAGMENT: &str = "Node passes the fragment (`#...`) in req.url";
const TRAILER_FRAMING: &str = "llhttp refuses Content-Length and Transfer-Encoding in \
     trailers (400); docs/http.md drops them";
const CODINGS: &str = "Node does not refuse transfer codings it cannot decode, an empty \
     Transfer-Encoding, or Transfer-Encoding on HTTP/1.0";
const VERSIONS: &str = "llhttp serves HTTP/0.9 and 2.0 request lines and refuses other \
     versions with 400, not 505";

/// Every corpus case Node's HTTP server does not pass, and why.
const DEVIATIONS: &[(&str, &str)] = &[
    ("chunked/extension-bws", CHUNK_EXTENSIONS),
    ("chunked/extension-empty-value", CHUNK_EXTENSIONS),
    ("chunked/extension-no-name", CHUNK_EXTENSIONS),
    ("chunked/extension-too-long", CHUNK_EXTENSIONS),
    ("chunked/size-17-digits", CHUNK_SIZES),
    ("chunked/size-overflow", CHUNK_SIZES),
    (
        "content-length/leading-zeros",
        "Node passes Content-Length as sent (`005`)",
    ),
    ("content-length/list-equal", CONTENT_LENGTH_REPEATED),
    ("content-length/two-lines-equal", CONTENT_LENGTH_REPEATED),
    (
        "fields/expect-other",
        "Node answers 417 but keeps the connection open",
    ),
    ("host/absolute-form-wins", ABSOLUTE_HOST),
    ("host/bad-port", HOST_UNCHECKED),
    ("host/duplicate-case", HOST_UNCHECKED),
    ("host/duplicate-equal", HOST_UNCHECKED),
    ("host/duplicate-http10", HOST_UNCHECKED),
    ("host/duplicate", HOST_UNCHECKED),
    ("host/list-value", HOST_UNCHECKED),
    ("host/slash-in-value", HOST_UNCHECKED),
    ("host/space-in-value", HOST_UNCHECKED),
    ("host/userinfo", HOST_UNCHECKED),
    ("limits/field-line-8191", HEAD_LIMIT),
    ("limits/fields-101", HEAD_LIMIT),
    ("limits/head-too-large", HEAD_RESET),
    ("limits/request-line-8191", HEAD_LIMIT),
    ("limits/uri-1mb", HEAD_RESET),
    ("pipelining/close-then-get", AFTER_CLOSE),
    ("pipelining/http10-then-get", AFTER_CLOSE),
    ("pipelining/invalid-then-valid", HOST_UNCHECKED),
    ("pipelining/valid-then-invalid", HOST_UNCHECKED),
    (
        "request-line/connect",
        "Node closes a CONNECT without an answer (no 501) when the app has no 'connect' listener",
    ),
    ("request-line/leading-bare-lf", REQUEST_LINE),
    ("request-line/lowercase-method", METHODS),
    ("request-line/method-token-chars", METHODS),
    ("request-line/missing-version", REQUEST_LINE),
    ("request-line/two-spaces-after-method", REQUEST_LINE),
    ("request-line/two-spaces-after-target", REQUEST_LINE),
    ("target/absolute-form-empty-host", ABSOLUTE_UNCHECKED),
    ("target/absolute-form-ftp", ABSOLUTE_UNCHECKED),
    ("target/absolute-form-https-upper", ABSOLUTE_HOST),
    ("target/absolute-form-no-path", ABSOLUTE_HOST),
    ("target/absolute-form-port", ABSOLUTE_HOST),
    ("target/absolute-form-query-no-path", ABSOLUTE_HOST),
    ("target/absolute-form-userinfo", ABSOLUTE_UNCHECKED),
    ("target/absolute-form", ABSOLUTE_HOST),
    ("target/asterisk-with-get", TARGET_UNCHECKED),
    ("target/bad-percent", TARGET_UNCHECKED),
    ("target/fragment-after-query", FRAGMENT),
    ("target/fragment-stripped", FRAGMENT),
    ("target/fragment-with-question", FRAGMENT),
    ("target/truncated-percent", TARGET_UNCHECKED),
    ("trailers/content-length", TRAILER_FRAMING),
    (
        "trailers/too-many",
        "Node's limit is the whole head, not 100 trailer lines",
    ),
    ("trailers/transfer-encoding", TRAILER_FRAMING),
    ("transfer-encoding/empty", CODINGS),
    ("transfer-encoding/gzip-chunked-two-lines", CODINGS),
    ("transfer-encoding/gzip-chunked", CODINGS),
    ("transfer-encoding/http10", CODINGS),
    ("version/h2-preface", VERSIONS),
    ("version/http09", VERSIONS),
    ("version/http12-as-11", VERSIONS),
    ("version/http20", VERSIONS),
    ("version/http30", VERSIONS),
];

/// Cases run at once: Node serves many connections in each worker, and a
/// case Node leaves waiting costs the 5 s read timeout.
const AT_ONCE: usize = 8;

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// What went wrong with each failing case, by name.
fn failures(pool: &DemoPool) -> BTreeMap<String, String> {
    let cases = http_corpus::load_cases();
    let per_thread = cases.len().div_ceil(AT_ONCE);
    std::thread::scope(|scope| {
        let running: Vec<_> = cases
            .chunks(per_thread)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|case| {
                            let what = http_corpus::run_case(pool.addr, case).err()?;
                            Some((case.name.clone(), what))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        running
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    })
}

#[test]
fn forkpool_node_passes_the_corpus_but_its_listed_deviations() {
    let Some(node) = common::require_program("node", "bash .ci/deps/node.sh") else {
        return;
    };
    let helper = clients().join("node/forkpool-node.js");
    let app = clients().join("tests/echo_app.js");
    let cmd = [
        node.to_str().unwrap(),
        helper.to_str().unwrap(),
        app.to_str().unwrap(),
    ];
    let pool = DemoPool::start_run(&["--min-children", "2"], &cmd);
    let failed = failures(&pool);
    let listed: BTreeMap<&str, &str> = DEVIATIONS.iter().copied().collect();
    let unlisted: Vec<String> = failed
        .iter()
        .filter(|(case, _)| !listed.contains_key(case.as_str()))
        .map(|(case, what)| format!("{case}: {what}"))
        .collect();
    let passing: Vec<&str> = listed
        .keys()
        .copied()
        .filter(|case| !failed.contains_key(*case))
        .collect();
    assert!(
        unlisted.is_empty(),
        "{} corpus cases failed:\n{}",
        unlisted.len(),
        unlisted.join("\n")
    );
    assert!(
        passing.is_empty(),
        "listed deviations that now pass (take them off DEVIATIONS and the README): {passing:?}"
    );
}
