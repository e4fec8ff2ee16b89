//! `/live` and `/ready`: the answers for liveness and readiness probes.
//!
//! - `/live` answers `200` whenever the supervisor answers at all: the
//!   request is served from its event loop, so an answer proves the loop is
//!   turning. It stays `200` while draining and stopping, so an orchestrator
//!   does not restart a pool that is shutting down on purpose.
//! - `/ready` answers `200` when the balancer should send work: the pool is
//!   serving (not starting, draining or stopping) and a child can take the
//!   connection soon (see [`Capacity::can_take_work`]). With
//!   [`ReadyPolicy::unready_when_saturated`], a pool whose every child is
//!   busy answers `503` too, so traffic goes elsewhere until a child frees.
//!   Otherwise `503 Service Unavailable`, with the reason in the body.
//!
//! Other methods than `GET` and `HEAD` get `405`; a malformed request gets
//! `400` with what was wrong.

use super::request::{HeadError, Method, RequestHead, Route};
use super::{Capacity, Phase};

/// How strict `/ready` is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadyPolicy {
    /// Answer not ready while the pool is saturated (every child it may
    /// have is busy or starting).
    pub unready_when_saturated: bool,
}

/// A health answer: status code and a short plain-text body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthAnswer {
    /// The HTTP status code.
    pub status: u16,
    /// One line for a person reading the probe's output, newline included.
    pub body: String,
}

impl HealthAnswer {
    fn new(status: u16, body: impl Into<String>) -> HealthAnswer {
        let mut body = body.into();
        body.push('\n');
        HealthAnswer { status, body }
    }

    /// True for a 2xx status.
    pub fn is_ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The reason phrase of the status code.
    pub fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            400 => "Bad Request",
            405 => "Method Not Allowed",
            503 => "Service Unavailable",
            _ => "Unknown",
        }
    }

    /// The whole HTTP/1.1 response, closing the connection; without the
    /// body for a `HEAD` request.
    pub fn to_http(&self, method: Method) -> Vec<u8> {
        let allow = if self.status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: {}\r\nCache-Control: no-store\r\n{allow}Connection: close\r\n\r\n",
            self.status,
            self.reason(),
            self.body.len()
        )
        .into_bytes();
        if method != Method::Head {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// The `/live` answer.
pub fn live(capacity: &Capacity) -> HealthAnswer {
    let word = match capacity.phase {
        Phase::Starting => "live (starting)",
        Phase::Serving => "live",
        Phase::Draining => "live (draining)",
        Phase::Stopping => "live (stopping)",
    };
    HealthAnswer::new(200, word)
}

/// The `/ready` answer.
pub fn ready(capacity: &Capacity, policy: ReadyPolicy) -> HealthAnswer {
    let not_ready = |why: &str| HealthAnswer::new(503, format!("not ready: {why}"));
    match capacity.phase {
        Phase::Starting => not_ready("starting"),
        Phase::Draining => not_ready("draining"),
        Phase::Stopping => not_ready("stopping"),
        Phase::Serving if !capacity.can_take_work() => not_ready("no ready child"),
        Phase::Serving if policy.unready_when_saturated && capacity.saturated() => {
            not_ready("saturated")
        }
        Phase::Serving => HealthAnswer::new(200, "ready"),
    }
}

/// The answer to a parsed request, or `None` when its path is not a
/// health endpoint (the caller serves it as before, e.g. the metrics).
pub fn answer(
    head: &Result<RequestHead, HeadError>,
    capacity: &Capacity,
    policy: ReadyPolicy,
) -> Option<HealthAnswer> {
    let head = match head {
        Ok(head) => head,
        Err(e) => return Some(HealthAnswer::new(400, e.to_string())),
    };
    let route = head.route();
    if route != Route::Other && head.method == Method::Other {
        return Some(HealthAnswer::new(405, "use GET or HEAD"));
    }
    match route {
        Route::Live => Some(live(capacity)),
        Route::Ready => Some(ready(capacity, policy)),
        Route::Other => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::request::parse_head;
    use crate::fleet::tests::serving;

    const STRICT: ReadyPolicy = ReadyPolicy {
        unready_when_saturated: true,
    };

    fn with_phase(phase: Phase) -> Capacity {
        Capacity {
            phase,
            ..serving(2, 0, 4)
        }
    }

    #[test]
    fn live_is_200_in_every_phase() {
        for phase in [
            Phase::Starting,
            Phase::Serving,
            Phase::Draining,
            Phase::Stopping,
        ] {
            assert_eq!(live(&with_phase(phase)).status, 200, "{phase:?}");
        }
    }

    #[test]
    fn ready_when_serving_with_a_child() {
        let a = ready(&serving(1, 1, 4), ReadyPolicy::default());
        assert_eq!((a.status, a.body.as_str()), (200, "ready\n"));
        assert!(a.is_ok());
    }

    #[test]
    fn not_ready_unless_serving() {
        for (phase, why) in [
            (Phase::Starting, "starting"),
            (Phase::Draining, "draining"),
            (Phase::Stopping, "stopping"),
        ] {
            let a = ready(&with_phase(phase), ReadyPolicy::default());
            assert_eq!(a.status, 503);
            assert_eq!(a.body, format!("not ready: {why}\n"));
        }
    }

    #[test]
    fn not_ready_without_a_child_to_serve() {
        let c = Capacity {
            spawn_held_back: true,
            ..serving(0, 0, 4)
        };
        let a = ready(&c, ReadyPolicy::default());
        assert_eq!(
            (a.status, a.body.as_str()),
            (503, "not ready: no ready child\n")
        );
    }

    #[test]
    fn saturation_counts_only_with_the_flag() {
        let full = serving(0, 4, 4);
        assert_eq!(ready(&full, ReadyPolicy::default()).status, 200);
        let a = ready(&full, STRICT);
        assert_eq!((a.status, a.body.as_str()), (503, "not ready: saturated\n"));
        assert_eq!(ready(&serving(1, 3, 4), STRICT).status, 200);
    }

    #[test]
    fn answers_route_by_path_and_method() {
        let c = serving(1, 0, 4);
        let ask = |raw: &str| {
            let head = parse_head(raw.as_bytes()).map(|h| h.expect("complete"));
            answer(&head, &c, ReadyPolicy::default())
        };
        assert_eq!(ask("GET /ready HTTP/1.1\r\n\r\n").unwrap().status, 200);
        assert_eq!(ask("GET /live HTTP/1.1\r\n\r\n").unwrap().status, 200);
        assert_eq!(ask("DELETE /live HTTP/1.1\r\n\r\n").unwrap().status, 405);
        assert_eq!(ask("GET /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(ask("POST /metrics HTTP/1.1\r\n\r\n"), None);
        let bad = answer(
            &parse_head(b"\x00\x01 nonsense\r\n\r\n").map(|h| h.unwrap()),
            &c,
            ReadyPolicy::default(),
        )
        .unwrap();
        assert_eq!(bad.status, 400);
    }

    #[test]
    fn http_rendering() {
        let a = ready(&with_phase(Phase::Draining), ReadyPolicy::default());
        let text = String::from_utf8(a.to_http(Method::Get)).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("Content-Length: 20\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nnot ready: draining\n"));
        let head = String::from_utf8(a.to_http(Method::Head)).unwrap();
        assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
        assert!(head.contains("Content-Length: 20\r\n"));
        let denied = HealthAnswer::new(405, "use GET or HEAD").to_http(Method::Other);
        assert!(String::from_utf8(denied)
            .unwrap()
            .contains("Allow: GET, HEAD\r\n"));
    }
}
