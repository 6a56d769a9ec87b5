//! A bounded look at the hub's host before hf-hub, which has no timeouts, is let near it:
//! a DNS lookup on a thread of its own and a TCP connect, both within one budget.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Host and port of an http(s) URL.
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(default_port);
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default_port)),
    }
}

pub(super) fn proxy_configured() -> bool {
    [
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ]
    .iter()
    .any(|v| std::env::var(v).map(|s| !s.is_empty()).unwrap_or(false))
}

/// Resolves and connects to the host of `url` within `timeout`.
pub(super) fn probe(url: &str, timeout: Duration) -> Result<(), String> {
    let (host, port) = host_port(url).ok_or_else(|| format!("cannot parse hub URL {url}"))?;
    let (tx, rx) = mpsc::channel();
    let h = host.clone();
    std::thread::spawn(move || {
        let res = (h.as_str(), port)
            .to_socket_addrs()
            .map(|a| a.collect::<Vec<_>>());
        let _ = tx.send(res);
    });
    let start = Instant::now();
    let addrs = match rx.recv_timeout(timeout) {
        Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
        Ok(Ok(_)) => return Err(format!("{host} resolves to no address")),
        Ok(Err(e)) => return Err(format!("cannot resolve {host}: {e}")),
        Err(_) => {
            return Err(format!(
                "resolving {host} took over {:.1}s",
                timeout.as_secs_f64()
            ))
        }
    };
    let mut last = String::new();
    for addr in addrs.iter().take(3) {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("cannot connect to {host} ({addr}): {e}"),
        }
    }
    if last.is_empty() {
        last = format!(
            "connecting to {host} took over {:.1}s",
            timeout.as_secs_f64()
        );
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_and_port() {
        assert_eq!(
            host_port("https://example.org/a/b"),
            Some(("example.org".into(), 443))
        );
        assert_eq!(
            host_port("http://127.0.0.1:9/x"),
            Some(("127.0.0.1".into(), 9))
        );
        assert_eq!(
            host_port("https://[::1]:8443/x"),
            Some(("::1".into(), 8443))
        );
        assert_eq!(host_port("nonsense"), None);
    }

    #[test]
    fn probe_fails_fast_on_closed_port() {
        // Port 9 (discard) on loopback: nothing listens, the connect is refused at once.
        let t = Instant::now();
        assert!(probe("http://127.0.0.1:9/", Duration::from_secs(2)).is_err());
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}
