//! The server a benchmark talks to: an `http://` URL on a loopback address.
//!
//! The URL is parsed here by hand, without DNS: the benchmark must never send
//! load anywhere but this machine, so a host is accepted only when it is a
//! loopback address literal (`127.0.0.0/8`, `[::1]`) or `localhost`, which
//! is taken to mean `127.0.0.1` without asking a resolver.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Where to connect and what to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The address to connect to; always loopback.
    pub addr: SocketAddr,
    /// The `Host` header: the URL's authority as written.
    pub host: String,
    /// Path and query, always starting with `/`.
    pub path: String,
}

impl Target {
    /// Parses `http://HOST[:PORT][/PATH][?QUERY]`.
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest = strip_scheme(url)?;
        let rest = rest.split('#').next().unwrap_or_default();
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        if authority.is_empty() {
            return Err(format!(
                "'{url}' has no host: write it like http://127.0.0.1:8080/"
            ));
        }
        if authority.contains('@') {
            return Err(format!("'{url}': user names in URLs are not supported"));
        }
        let (host, port) = split_host_port(authority)
            .ok_or_else(|| format!("'{url}': cannot read host and port in '{authority}'"))?;
        let ip = loopback_ip(host).map_err(|why| format!("'{url}': {why}"))?;
        let path = match path.strip_prefix('?') {
            Some(query) => format!("/?{query}"),
            None if path.is_empty() => "/".to_string(),
            None => path.to_string(),
        };
        Ok(Target {
            addr: SocketAddr::new(ip, port),
            host: authority.to_string(),
            path,
        })
    }

    /// The target of a server listening on `addr`.
    pub fn at(addr: SocketAddr, path: &str) -> Target {
        Target {
            addr,
            host: addr.to_string(),
            path: path.to_string(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.host, self.path)
    }
}

fn strip_scheme(url: &str) -> Result<&str, String> {
    match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => Ok(rest),
        Some((scheme, _)) => Err(format!(
            "'{url}': only http:// is supported, not {scheme}://"
        )),
        None => Err(format!(
            "'{url}' is not a URL: write it like http://127.0.0.1:8080/"
        )),
    }
}

/// Splits `host:port`, `[v6]:port`, `host` or `[v6]`; the port defaults to 80.
fn split_host_port(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 80,
    };
    Some((host, port))
}

fn loopback_ip(host: &str) -> Result<IpAddr, String> {
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let ip: IpAddr = host.parse().map_err(|_| {
        format!(
            "host '{host}' is not an IP address; use 127.0.0.1 or [::1] (names are not resolved)"
        )
    })?;
    if !ip.is_loopback() {
        return Err(format!(
            "refusing non-loopback host {ip}: forkpool-bench only sends load to 127.0.0.1 or [::1]"
        ));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_url() {
        let t = Target::parse("http://127.0.0.1:8081/hello?work_ms=5&cpu_ms=1").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:8081");
        assert_eq!(t.path, "/hello?work_ms=5&cpu_ms=1");
        assert_eq!(
            t.to_string(),
            "http://127.0.0.1:8081/hello?work_ms=5&cpu_ms=1"
        );
    }

    #[test]
    fn defaults_and_odd_shapes() {
        let t = Target::parse("http://127.0.0.1").unwrap();
        assert_eq!((t.addr.port(), t.path.as_str()), (80, "/"));
        let t = Target::parse("HTTP://localhost:9?x=1#frag").unwrap();
        assert_eq!(t.addr, "127.0.0.1:9".parse().unwrap());
        assert_eq!(t.path, "/?x=1");
        let t = Target::parse("http://[::1]:8082/").unwrap();
        assert_eq!(t.addr, "[::1]:8082".parse().unwrap());
        let t = Target::parse("http://[::1]").unwrap();
        assert_eq!(t.addr.port(), 80);
        let t = Target::parse("http://127.1.2.3:1/").unwrap();
        assert!(t.addr.ip().is_loopback());
    }

    #[test]
    fn refuses_non_loopback_hosts() {
        for url in [
            "http://10.0.0.1:80/",
            "http://0.0.0.0:80/",
            "http://[2001:db8::1]:80/",
            "http://192.168.1.1/",
        ] {
            let err = Target::parse(url).unwrap_err();
            assert!(err.contains("refusing non-loopback host"), "{url}: {err}");
        }
        let err = Target::parse("http://example.com/").unwrap_err();
        assert!(err.contains("not an IP address"), "{err}");
    }

    #[test]
    fn rejects_malformed_urls() {
        for url in [
            "127.0.0.1:80",
            "https://127.0.0.1/",
            "http:///x",
            "http://127.0.0.1:port/",
            "http://127.0.0.1:99999/",
            "http://[::1/",
            "http://u@127.0.0.1/",
        ] {
            assert!(Target::parse(url).is_err(), "{url} should be rejected");
        }
    }
}
