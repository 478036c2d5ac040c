//! HTTP to one registry: URLs, redirects, timeouts, and logging in when a request is refused.

use super::auth::{parse_challenge, Challenge, Credentials};
use super::{printable, RegistryError};
use reqwest::blocking::{RequestBuilder, Response};
use reqwest::header::WWW_AUTHENTICATE;
use std::io::Read;
use std::sync::Mutex;
use std::time::Duration;

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Plain HTTP (a local registry); without it only HTTPS is spoken, redirects included.
    pub insecure: bool,
    pub credentials: Option<Credentials>,
    /// A response that sends nothing for this long is given up (and retried).
    pub stall_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            insecure: false,
            credentials: None,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

/// The largest token response, error body or other small document read from a registry.
pub const MAX_SMALL_BODY: u64 = 1 << 20;

/// Redirects followed per request (a registry sends blob requests to a CDN: one or two).
const MAX_REDIRECTS: usize = 10;

/// What a refused request is retried with.
#[derive(Clone)]
enum Login {
    Basic(Credentials),
    Bearer(String),
}

pub struct Client {
    http: reqwest::blocking::Client,
    scheme: &'static str,
    host: String,
    opts: ClientOptions,
    login: Mutex<Option<Login>>,
}

impl Client {
    /// A client for the registry at `host` (`registry.ollama.ai`, `127.0.0.1:5000`).
    pub fn new(host: &str, opts: ClientOptions) -> Result<Client, RegistryError> {
        let insecure = opts.insecure;
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else if attempt.url().scheme() != "https" && !insecure {
                let to = attempt.url().to_string();
                attempt.error(format!(
                    "redirected to `{}`, which is not HTTPS; pass --insecure to allow plain HTTP",
                    printable(&to, 200)
                ))
            } else {
                attempt.follow()
            }
        });
        let http = reqwest::blocking::Client::builder()
            .redirect(policy)
            .connect_timeout(opts.stall_timeout)
            // Each wait (for the headers, for each read of the body) is bounded by this: a
            // stalled stream ends, a slow but moving one does not.
            .timeout(opts.stall_timeout)
            .https_only(!insecure)
            .user_agent(concat!("zimage/", env!("CARGO_PKG_VERSION")))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| RegistryError::ClientStart {
                reason: e.to_string(),
            })?;
        Ok(Client {
            http,
            scheme: if insecure { "http" } else { "https" },
            host: host.to_string(),
            opts,
            login: Mutex::new(None),
        })
    }

    pub fn options(&self) -> &ClientOptions {
        &self.opts
    }

    /// `<scheme>://<host><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{}", self.scheme, self.host, path)
    }

    /// A `Location` a registry answered with, made absolute and checked: same rules as any
    /// other URL this client visits.
    pub fn resolve(&self, base: &str, location: &str) -> Result<String, RegistryError> {
        let bad = |reason: String| RegistryError::Protocol {
            url: base.to_string(),
            reason,
        };
        let base_url = reqwest::Url::parse(base).map_err(|e| bad(e.to_string()))?;
        let url = base_url.join(location).map_err(|e| {
            bad(format!(
                "the registry answered with the location `{}`: {e}",
                printable(location, 200)
            ))
        })?;
        if url.scheme() != "https" && !(self.opts.insecure && url.scheme() == "http") {
            return Err(bad(format!(
                "the registry answered with the location `{}`, which is not HTTPS; pass \
                 --insecure to allow plain HTTP",
                printable(location, 200)
            )));
        }
        Ok(url.into())
    }

    /// Sends the request `build` makes, logging in and sending it again once when the
    /// registry refuses it with a challenge. The status is the caller's to check.
    pub fn send(
        &self,
        url: &str,
        build: &dyn Fn(&reqwest::blocking::Client) -> RequestBuilder,
    ) -> Result<Response, RegistryError> {
        let mut logged_in = false;
        loop {
            let mut request = build(&self.http);
            let login = self.login.lock().unwrap_or_else(|e| e.into_inner()).clone();
            request = match login {
                Some(Login::Basic(c)) => request.basic_auth(c.user, Some(c.password)),
                Some(Login::Bearer(t)) => request.bearer_auth(t),
                None => request,
            };
            let response = request.send().map_err(|e| self.http_error(url, &e))?;
            if response.status() != reqwest::StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            if logged_in {
                return Err(RegistryError::Auth {
                    url: url.to_string(),
                    reason: match &self.opts.credentials {
                        Some(c) => format!(
                            "the registry refused user `{}`: check the user and password \
                             (--user USER:PASSWORD or --credentials FILE)",
                            printable(&c.user, 80)
                        ),
                        None => "the registry refused the request even after logging in \
                                 anonymously; give --user USER:PASSWORD or --credentials FILE"
                            .into(),
                    },
                });
            }
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            self.log_in(url, challenge.as_deref())?;
            logged_in = true;
        }
    }

    /// Answers a 401's challenge: basic credentials, or a token from the realm.
    fn log_in(&self, url: &str, challenge: Option<&str>) -> Result<(), RegistryError> {
        let auth_err = |reason: String| RegistryError::Auth {
            url: url.to_string(),
            reason,
        };
        let challenge = challenge.and_then(parse_challenge).ok_or_else(|| {
            auth_err(format!(
                "the registry asks for a login with {}, which zimage does not speak (it speaks \
                 Basic and Bearer)",
                challenge.map_or("no WWW-Authenticate challenge".into(), |c| format!(
                    "`{}`",
                    printable(c, 120)
                ))
            ))
        })?;
        let login = match challenge {
            Challenge::Basic => Login::Basic(self.opts.credentials.clone().ok_or_else(|| {
                auth_err(
                    "the registry asks for a login: give --user USER:PASSWORD or --credentials \
                     FILE"
                        .into(),
                )
            })?),
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => Login::Bearer(self.token(url, &realm, service, scope)?),
        };
        *self.login.lock().unwrap_or_else(|e| e.into_inner()) = Some(login);
        Ok(())
    }

    /// A token from the challenge's realm, asked for with the credentials when there are any.
    fn token(
        &self,
        url: &str,
        realm: &str,
        service: Option<String>,
        scope: Option<String>,
    ) -> Result<String, RegistryError> {
        let auth_err = |reason: String| RegistryError::Auth {
            url: url.to_string(),
            reason,
        };
        let realm_url = self.resolve(url, realm)?;
        let mut query: Vec<(&str, String)> = Vec::new();
        query.extend(service.map(|s| ("service", s)));
        query.extend(scope.map(|s| ("scope", s)));
        let mut request = self.http.get(&realm_url).query(&query);
        if let Some(c) = &self.opts.credentials {
            request = request.basic_auth(&c.user, Some(&c.password));
        }
        let response = request
            .send()
            .map_err(|e| self.http_error(&realm_url, &e))?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(auth_err(match &self.opts.credentials {
                Some(c) => format!(
                    "the token service `{}` refused user `{}`: check the user and password",
                    printable(&realm_url, 200),
                    printable(&c.user, 80)
                ),
                None => format!(
                    "the token service `{}` wants a login: give --user USER:PASSWORD or \
                     --credentials FILE",
                    printable(&realm_url, 200)
                ),
            }));
        }
        if !status.is_success() {
            return Err(self.status_error(&realm_url, response));
        }
        let body = self.read_small(&realm_url, response, MAX_SMALL_BODY, "token response")?;
        #[derive(serde::Deserialize)]
        struct TokenResponse {
            token: Option<String>,
            access_token: Option<String>,
        }
        let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            auth_err(format!(
                "the token service `{}` answered something that is no token: {e}",
                printable(&realm_url, 200)
            ))
        })?;
        let token = parsed
            .token
            .or(parsed.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| {
                auth_err(format!(
                    "the token service `{}` answered without a usable `token`",
                    printable(&realm_url, 200)
                ))
            })?;
        Ok(token)
    }

    /// A body of at most `limit` bytes, read whole.
    pub fn read_small(
        &self,
        url: &str,
        response: Response,
        limit: u64,
        what: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        let too_big = |n: String| RegistryError::Protocol {
            url: url.to_string(),
            reason: format!(
                "the {what} is {n} bytes, more than the {limit} zimage reads; the registry is \
                 not serving what it should"
            ),
        };
        if let Some(n) = response.content_length().filter(|&n| n > limit) {
            return Err(too_big(n.to_string()));
        }
        let mut body = Vec::new();
        response
            .take(limit + 1)
            .read_to_end(&mut body)
            .map_err(|e| self.read_error(url, &e))?;
        if body.len() as u64 > limit {
            return Err(too_big("more than that".into()));
        }
        Ok(body)
    }

    /// A status the caller did not expect, with the registry's own error message if it sent one.
    pub fn status_error(&self, url: &str, response: Response) -> RegistryError {
        let status = response.status().as_u16();
        let body = self
            .read_small(url, response, 64 << 10, "error response")
            .unwrap_or_default();
        #[derive(serde::Deserialize)]
        struct Errors {
            errors: Vec<ErrorEntry>,
        }
        #[derive(serde::Deserialize)]
        struct ErrorEntry {
            code: Option<String>,
            message: Option<String>,
        }
        let detail = serde_json::from_slice::<Errors>(&body)
            .ok()
            .and_then(|e| e.errors.into_iter().next())
            .map(|e| {
                [e.code, e.message]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(": ")
            })
            .unwrap_or_default();
        RegistryError::Status {
            url: url.to_string(),
            status,
            detail: printable(&detail, 200),
        }
    }

    /// A failed request, said in one line: what failed, and the stall limit when it was a stall.
    pub fn http_error(&self, url: &str, e: &reqwest::Error) -> RegistryError {
        let reason = if e.is_timeout() {
            self.stall_reason()
        } else {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                let s = s.to_string();
                if !reason.contains(&s) {
                    reason = format!("{reason}: {s}");
                }
                source = s_source(source);
            }
            reason
        };
        RegistryError::Http {
            url: url.to_string(),
            reason,
        }
    }

    /// A failed read of a body.
    pub fn read_error(&self, url: &str, e: &std::io::Error) -> RegistryError {
        let timed_out = e.kind() == std::io::ErrorKind::TimedOut
            || e.get_ref()
                .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
                .is_some_and(|r| r.is_timeout());
        RegistryError::Http {
            url: url.to_string(),
            reason: if timed_out {
                self.stall_reason()
            } else {
                format!("the download broke off: {e}")
            },
        }
    }

    fn stall_reason(&self) -> String {
        format!(
            "the registry sent nothing for {} s; gave up (a later run resumes; \
             --stall-timeout sets the limit)",
            self.opts.stall_timeout.as_secs_f64()
        )
    }
}

fn s_source<'a>(
    e: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    e.and_then(|e| e.source())
}
