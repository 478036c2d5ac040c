//! Which browser requests a server without an API key answers. Such a server listens on
//! loopback, where any web page the user opens could otherwise reach it: by a request the page
//! sends across sites, or by a name of the attacker's that resolves to 127.0.0.1 (DNS
//! rebinding). As Ollama does, a request must name a loopback host (a name of this machine or
//! an address), and a browser's `Origin` must be this server, a page on loopback, a desktop
//! app's scheme, or one listed in `ZIMAGE_ORIGINS` (or `OLLAMA_ORIGINS`). Clients that are no
//! browser send no `Origin` and are not concerned.

use std::net::IpAddr;

/// The variables that list more allowed origins, comma-separated (`*` matches any run).
pub const ORIGINS_VARS: [&str; 2] = ["ZIMAGE_ORIGINS", "OLLAMA_ORIGINS"];

/// Schemes of desktop apps' pages (Electron, Tauri, editors' webviews) and local files.
const APP_SCHEMES: [&str; 5] = ["app", "file", "tauri", "vscode-webview", "vscode-file"];

/// The origins allowed beyond the defaults, read once from [`ORIGINS_VARS`].
pub fn extra_origins() -> &'static [String] {
    static EXTRA: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    EXTRA.get_or_init(read_extra_origins)
}

fn read_extra_origins() -> Vec<String> {
    ORIGINS_VARS
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .flat_map(|list| {
            list.split(',')
                .map(|o| o.trim().to_string())
                .filter(|o| !o.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A request's `Host` and `Origin` headers as text, each `None` when absent. A header whose
/// bytes are not ASCII text cannot be checked, so it is an error naming it, never taken as
/// absent: a raw UTF-8 `Host: évil.example` is no name of this machine.
pub fn host_and_origin(
    headers: &axum::http::HeaderMap,
) -> Result<(Option<&str>, Option<&str>), String> {
    let read = |name: axum::http::header::HeaderName| {
        match headers.get(&name) {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| {
            format!(
                "the request's `{name}` header is not ASCII text, so this server cannot check it; send names as ASCII (punycode for international ones)"
            )
        }),
    }
    };
    Ok((
        read(axum::http::header::HOST)?,
        read(axum::http::header::ORIGIN)?,
    ))
}

/// Whether a browser says the request comes from a page of another site (`Sec-Fetch-Site:
/// cross-site`): an `<img>` or a form of that page, which sends no `Origin` for a GET.
pub fn from_another_site(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"))
}

/// Whether `method` only reads (GET, HEAD, OPTIONS): every other one may change state.
pub fn is_safe_method(method: &axum::http::Method) -> bool {
    use axum::http::Method;
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The name in a `Host` header or an origin's authority, without its port.
fn hostname(authority: &str) -> &str {
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or("");
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

fn is_loopback_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// Whether a request naming `host` (its `Host` header) is one for this machine: an address,
/// `localhost`, or the machine's own name. Another name that reaches a loopback server was
/// made to resolve there.
pub fn host_allowed(host: &str, machine: Option<&str>) -> bool {
    let name = hostname(host);
    name.parse::<IpAddr>().is_ok()
        || is_loopback_name(name)
        || machine.is_some_and(|m| m.eq_ignore_ascii_case(name))
}

/// Whether a browser page of `origin` may use a server reached as `host`.
pub fn origin_allowed(origin: &str, host: Option<&str>, extra: &[String]) -> bool {
    if extra.iter().any(|pattern| matches(pattern, origin)) {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    if APP_SCHEMES.contains(&scheme) {
        return true;
    }
    if !matches!(scheme, "http" | "https") {
        return false;
    }
    if same_origin(origin, host) {
        return true;
    }
    let name = hostname(authority);
    is_loopback_name(name)
        || name
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

/// Whether a page of `origin` is this server's own, reached as `host`.
pub fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    host.is_some_and(|h| h == authority)
}

/// Whether `text` matches `pattern`, whose `*` matches any run of characters.
fn matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// This machine's name, as `Host` headers may carry it; read once.
pub fn machine_name() -> Option<&'static str> {
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NAME.get_or_init(read_machine_name).as_deref()
}

fn read_machine_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer it is given.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end])
        .ok()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_this_machine_pass_and_other_names_do_not() {
        for host in [
            "127.0.0.1:11434",
            "localhost:11434",
            "[::1]:8080",
            "app.localhost",
            "10.0.0.2",
        ] {
            assert!(host_allowed(host, None), "{host}");
        }
        assert!(host_allowed("MyMac:11434", Some("mymac")));
        assert!(!host_allowed("evil.example:11434", Some("mymac")));
        assert!(!host_allowed("localhost.evil.example", None));
    }

    #[test]
    fn pages_on_loopback_apps_and_listed_origins_pass() {
        let host = Some("127.0.0.1:11434");
        for origin in [
            "http://127.0.0.1:11434",
            "http://localhost:3000",
            "https://localhost",
            "http://[::1]:5173",
            "http://0.0.0.0:8080",
            "app://open-webui",
            "tauri://localhost",
        ] {
            assert!(origin_allowed(origin, host, &[]), "{origin}");
        }
        for origin in [
            "https://evil.example",
            "null",
            "http://127.0.0.1.evil.example",
        ] {
            assert!(!origin_allowed(origin, host, &[]), "{origin}");
        }
        let extra = vec!["https://*.example.com".to_string()];
        assert!(origin_allowed("https://ui.example.com", host, &extra));
        assert!(!origin_allowed("https://example.org", host, &extra));
    }

    #[test]
    fn globs_match_runs() {
        assert!(matches("*", "anything"));
        assert!(matches("https://a*b*c", "https://aXbYc"));
        assert!(!matches("https://a*b", "https://aXc"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
    }
}
