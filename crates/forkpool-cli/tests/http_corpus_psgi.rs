//! forkpool-psgi against the shared HTTP corpus (tests/http-corpus, rules
//! in docs/http.md), serving the echo app `clients/tests/echo_app.psgi`.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;

#[path = "common/corpus_check.rs"]
mod corpus_check;

#[path = "common/psgi_support.rs"]
mod psgi_support;

use serde_json::Value;

/// PSGI's one departure from the corpus's view of a request (docs/http.md,
/// "Transfer-Encoding"): a chunked body reaches the app de-chunked *with*
/// a CONTENT_LENGTH of its decoded size, because Plack's body readers
/// (Plack::Request, HTTP::Entity::Parser) read by CONTENT_LENGTH and would
/// otherwise read nothing, as with Starman. So where a case expects
/// `content-length` absent beside `transfer-encoding`, the PSGI server must
/// give the decoded length instead. Everything else is the corpus's.
fn as_psgi_sees_it(case: &mut http_corpus::Case) {
    for response in &mut case.responses {
        let Some(app) = response.get_mut("app") else {
            continue;
        };
        if app["headers"].get("transfer-encoding").is_none() {
            continue;
        }
        let length = app["body"].as_str().map_or(0, |b| b.chars().count());
        if let Some(absent) = app.get_mut("absent").and_then(Value::as_array_mut) {
            absent.retain(|name| name != "content-length");
        }
        app["headers"]["content-length"] = Value::String(length.to_string());
    }
}

#[test]
fn forkpool_psgi_passes_the_whole_corpus() {
    if common::require_program("perl", "apt-get install perl").is_none() {
        return;
    }
    let pool = psgi_support::start_echo_pool("4", &["--no-access-log", "--header-timeout", "5"]);
    let mut cases = http_corpus::load_cases();
    cases.iter_mut().for_each(as_psgi_sees_it);
    corpus_check::assert_every_case_passes(cases, |case| http_corpus::run_case(pool.addr, case));
}
