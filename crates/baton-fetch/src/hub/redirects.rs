//! A bounded walk of the hub's relative redirects before hf-hub is let near the file.
//!
//! hf-hub asks for a file's metadata without following redirects, then follows every
//! relative one (`Location: /path`) itself, with no limit: a server that redirects a
//! path to itself is asked again and again, as fast as it answers, until the process
//! ends (tens of thousands of requests a second on loopback), and the fetch ends as a
//! silent hub. An absolute redirect hf-hub hands to ureq, which stops after ten. So the
//! relative ones are walked here first, as hf-hub would walk them, and a fetch whose
//! redirects go round is refused after as many as ureq allows.

use std::str::FromStr;
use std::time::Duration;

use ureq::http::{StatusCode, Uri};

use super::super::FetchError;

/// Relative redirects followed before the walk is called a loop; ureq's own limit for
/// absolute ones, so both kinds are held to one bound.
pub(super) const MAX_REDIRECTS: usize = 10;

/// Follows `url`'s relative redirects as hf-hub's metadata request does (a one-byte
/// range, the token if any), each request within `timeout`. Ends quietly at the first
/// answer that is not a relative redirect, or at any error but a timeout: hf-hub asks
/// again and reports those in its own words. A walk longer than [`MAX_REDIRECTS`] is a
/// loop.
pub(super) fn check(url: &str, token: Option<&str>, timeout: Duration) -> Result<(), FetchError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into();
    let mut at = url.to_string();
    for hop in 0..=MAX_REDIRECTS {
        let mut req = agent.get(&at).header("Range", "bytes=0-0");
        if let Some(token) = token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let response = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Timeout(_)) => {
                return Err(FetchError::HubTimeout {
                    url: at,
                    stage: "did not answer".into(),
                    secs: timeout.as_secs_f64(),
                })
            }
            Err(_) => return Ok(()),
        };
        let Some(next) = relative_target(url, response.status(), response.headers()) else {
            return Ok(());
        };
        if hop == MAX_REDIRECTS {
            return Err(FetchError::Hub(format!(
                "{url}: too many redirects (over {MAX_REDIRECTS}, the last to {next}): the \
                 server sends the request round in a loop, so it is not a hub that serves \
                 files (check HF_ENDPOINT)"
            )));
        }
        at = next;
    }
    Ok(())
}

/// Where a relative redirect leads, joined to `base` as hf-hub joins it (the base's
/// scheme and host, the location's path and query); `None` for any other answer.
fn relative_target(
    base: &str,
    status: StatusCode,
    headers: &ureq::http::HeaderMap,
) -> Option<String> {
    let redirect = matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    );
    if !redirect {
        return None;
    }
    let location = Uri::from_str(headers.get("location")?.to_str().ok()?).ok()?;
    if location.host().is_some() {
        return None;
    }
    let mut parts = Uri::from_str(base).ok()?.into_parts();
    parts.path_and_query = location.into_parts().path_and_query;
    Uri::from_parts(parts).ok().map(|u| u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ureq::http::{HeaderMap, HeaderValue};

    fn to(location: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("location", HeaderValue::from_str(location).unwrap());
        h
    }

    #[test]
    fn only_a_relative_redirect_is_walked_and_it_keeps_the_base_host() {
        let base = "http://127.0.0.1:8/a/resolve/main/f";
        assert_eq!(
            relative_target(base, StatusCode::FOUND, &to("/b/c?x=1")).as_deref(),
            Some("http://127.0.0.1:8/b/c?x=1")
        );
        assert_eq!(
            relative_target(base, StatusCode::TEMPORARY_REDIRECT, &to("http://cdn/x")),
            None
        );
        assert_eq!(relative_target(base, StatusCode::OK, &to("/b")), None);
        assert_eq!(
            relative_target(base, StatusCode::FOUND, &HeaderMap::new()),
            None
        );
    }
}
