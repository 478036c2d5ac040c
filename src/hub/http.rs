//! HTTP to the Hub: redirects followed by hand, so that the token goes to the Hub's own origin
//! and never to the host a download is redirected to (the Hub sends LFS files to a CDN).

use super::HubError;
use crate::registry::printable;
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{AUTHORIZATION, LOCATION};
use reqwest::{StatusCode, Url};
use std::time::Duration;

/// Redirects followed per request (the Hub sends one, to its CDN; a renamed repository two).
const MAX_REDIRECTS: usize = 5;

/// What the Hub's own answer to a `resolve` URL says of the file, before any redirect.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// `X-Repo-Commit`: the commit the file is served from.
    pub commit: Option<String>,
    /// `X-Linked-Etag`, unquoted: an LFS file's sha256. (Its plain `ETag` may be the
    /// pointer's git id, so it says nothing of the bytes.)
    pub linked_etag: Option<String>,
}

impl Resolved {
    fn of(response: &Response) -> Resolved {
        let header = |name: &str| {
            let value = response.headers().get(name)?.to_str().ok()?;
            Some(
                value
                    .trim_start_matches("W/")
                    .trim_matches('"')
                    .to_ascii_lowercase(),
            )
        };
        Resolved {
            commit: header("x-repo-commit"),
            linked_etag: header("x-linked-etag"),
        }
    }
}

pub struct Hub {
    http: Client,
    endpoint: Url,
    token: Option<String>,
    stall_timeout: Duration,
}

impl Hub {
    pub fn new(
        endpoint: &str,
        token: Option<String>,
        stall_timeout: Duration,
    ) -> Result<Hub, HubError> {
        let endpoint = Url::parse(endpoint).map_err(|e| HubError::Endpoint {
            endpoint: printable(endpoint, 200),
            reason: e.to_string(),
        })?;
        let http = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(stall_timeout)
            // Each wait (for the headers, for each read of the body) is bounded by this.
            .timeout(stall_timeout)
            .user_agent(concat!("zimage/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HubError::Network {
                url: endpoint.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Hub {
            http,
            endpoint,
            token,
            stall_timeout,
        })
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// `{endpoint}/{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.endpoint.as_str().trim_end_matches('/'))
    }

    /// The Hub's page of a repository, for messages.
    pub fn page(&self, id: &str) -> String {
        self.url(id)
    }

    /// Sends `build`'s request to `url`, following redirects; the token goes along only while
    /// the URL is on the Hub's origin. The status is the caller's to check.
    pub fn get(
        &self,
        url: &str,
        build: &dyn Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<Response, HubError> {
        self.resolve(url, build).map(|(response, _)| response)
    }

    /// [`Hub::get`], with what the first answer (the Hub's own) says of the file.
    pub fn resolve(
        &self,
        url: &str,
        build: &dyn Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<(Response, Resolved), HubError> {
        let mut at = Url::parse(url).map_err(|e| HubError::Network {
            url: printable(url, 200),
            reason: e.to_string(),
        })?;
        let mut first = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut request = build(self.http.get(at.clone()));
            if let Some(token) = self.token.as_ref().filter(|_| self.is_hub(&at)) {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let response = request.send().map_err(|e| self.network(at.as_str(), &e))?;
            let first = first.get_or_insert_with(|| Resolved::of(&response));
            if !response.status().is_redirection() || response.status() == StatusCode::NOT_MODIFIED
            {
                return Ok((response, first.clone()));
            }
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| HubError::Protocol {
                    url: at.to_string(),
                    reason: "a redirect without a Location".into(),
                })?;
            let next = at.join(location).map_err(|e| HubError::Protocol {
                url: at.to_string(),
                reason: format!("the redirect to `{}`: {e}", printable(location, 200)),
            })?;
            if !matches!(next.scheme(), "http" | "https")
                || (at.scheme() == "https" && next.scheme() != "https")
            {
                return Err(HubError::Protocol {
                    url: at.to_string(),
                    reason: format!(
                        "redirected to `{}`, which is not HTTPS",
                        printable(next.as_str(), 200)
                    ),
                });
            }
            at = next;
        }
        Err(HubError::Protocol {
            url: url.to_string(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// The URL is on the Hub's own origin (scheme, host and port).
    fn is_hub(&self, url: &Url) -> bool {
        url.origin() == self.endpoint.origin()
    }

    /// A request that failed before an answer, in one line.
    pub fn network(&self, url: &str, e: &reqwest::Error) -> HubError {
        let mut reason = if e.is_timeout() {
            self.stall()
        } else {
            e.to_string()
        };
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            let s = s.to_string();
            if !reason.contains(&s) {
                reason = format!("{reason}: {s}");
            }
            source = source.and_then(|e| e.source());
        }
        HubError::Network {
            url: url.to_string(),
            reason,
        }
    }

    /// A body read that failed.
    pub fn read_error(&self, url: &str, e: &std::io::Error) -> HubError {
        HubError::Network {
            url: url.to_string(),
            reason: if e.kind() == std::io::ErrorKind::TimedOut {
                self.stall()
            } else {
                format!("the download broke off: {e}")
            },
        }
    }

    fn stall(&self) -> String {
        format!(
            "nothing came for {} s; gave up (a later run resumes)",
            self.stall_timeout.as_secs_f64()
        )
    }
}
