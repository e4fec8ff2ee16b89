//! The demo's request parser (crates/forkpool-cli/src/demo/request.rs)
//! against the shared HTTP corpus (tests/http-corpus, rules in
//! docs/http.md), directly, without a server: for each response a case
//! expects, the parser must refuse with that status, or give what the app
//! would see (method, path, query, headers, body).

#[path = "common/http_corpus.rs"]
mod http_corpus;

#[path = "common/corpus_check.rs"]
mod corpus_check;

use forkpool_cli::demo::request::{parse_message, Seen};
use serde_json::{json, Map, Value};

/// What the echo app would answer for `seen`.
fn as_json(seen: &Seen) -> Value {
    let headers: Map<String, Value> = seen
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), Value::String(value.clone())))
        .collect();
    json!({
        "method": seen.method,
        "path": seen.path,
        "query": seen.query,
        "headers": headers,
        "body": seen.body,
    })
}

/// Parses the case's bytes request after request, as the demo's server
/// reads them, and compares each with the response expected.
fn check(case: &http_corpus::Case) -> Result<(), String> {
    let mut rest: &[u8] = &case.request;
    for (i, expected) in case.responses.iter().enumerate() {
        let want = expected["status"].as_u64().unwrap_or(0);
        let outcome = match parse_message(rest) {
            Ok(Some((seen, used))) => {
                rest = &rest[used..];
                let Some(app) = expected.get("app") else {
                    // A status only (a HEAD answer): the request was served.
                    if want == 200 {
                        continue;
                    }
                    return Err(format!("response {}: parsed, expected {want}", i + 1));
                };
                http_corpus::check_app(app, &as_json(&seen))
                    .map_err(|e| format!("response {}: {e}", i + 1))
            }
            Ok(None) => Err(format!(
                "response {}: the parser waits for more bytes",
                i + 1
            )),
            Err(refusal) if u64::from(refusal.status) == want && expected.get("app").is_none() => {
                return Ok(()); // a refusal closes: nothing after it is read
            }
            Err(refusal) => Err(format!(
                "response {}: refused {} ({}), expected {want}",
                i + 1,
                refusal.status,
                refusal.why
            )),
        };
        outcome?;
    }
    Ok(())
}

#[test]
fn the_demo_parser_passes_the_whole_corpus() {
    corpus_check::assert_every_case_passes(http_corpus::load_cases(), check);
}
