//! The web console at `/console` on the admin port: the cluster (nodes,
//! partitions with leaders, terms and lag, sparklines of this node's own
//! metrics), worker sessions and job streams (quiet, resume, terminate), job
//! search, a job's page with its history, incidents with retry and cancel,
//! queues with their figures, pause and resume, cron schedules with
//! their next and last runs, pause, resume and delete, and workflows with
//! their steps' states and cancel.
//!
//! Owns the console's pages, its sign-in cookie and its metric samples. Every
//! read and every action goes through this node's job API in-process
//! ([`crate::gateway::api::JobApi`]), as the signed-in principal: it routes each
//! to the partition leaders wherever they are and checks the principal's
//! scopes and tenants, so each page works from any node and shows only what
//! its viewer may see. Pages are rendered on the server from templates
//! compiled into the binary.

use std::sync::{Arc, OnceLock};

use axum::extract::{Form, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use minijinja::{context, Environment, Value};
use serde::Deserialize;

use crate::auth::Principal;
use crate::context::NodeContext;
use crate::proto::gateway::*;

mod cluster;
mod jobs;
mod queues;
mod samples;
mod schedules;
mod time;
mod workers;
mod workflows;

pub use samples::run as sample_metrics;

/// The sign-in cookie: the bearer token, sent back only to `/console`.
pub const COOKIE: &str = "drover_console_token";
/// Jobs per page of a search.
pub(super) const PAGE_SIZE: i32 = 50;
/// Job states a search can ask for, in a job's usual order.
pub(super) const STATES: [&str; 7] =
    ["scheduled", "activatable", "activated", "incident", "completed", "cancelled", "expired"];

pub fn routes() -> Router<Arc<NodeContext>> {
    Router::new()
        .route("/console", get(cluster::cluster))
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/static/style.css", get(style))
        .route("/console/static/console.js", get(script))
        .route("/console/workers", get(workers::workers))
        .route("/console/workers/{session}/{state}", post(workers::direct_worker))
        .route("/console/jobs", get(jobs::jobs))
        .route("/console/jobs/{key}", get(jobs::job))
        .route("/console/jobs/{key}/retry", post(jobs::retry))
        .route("/console/jobs/{key}/cancel", post(jobs::cancel))
        .route("/console/incidents", get(jobs::incidents))
        .route("/console/incidents/retry", post(jobs::retry_all))
        .route("/console/queues", get(queues::queues))
        .route("/console/queues/paused", post(queues::set_paused))
        .route("/console/schedules", get(schedules::schedules).post(schedules::act))
        .route("/console/workflows", get(workflows::workflows).post(workflows::cancel))
}

/// Console paths open to anyone: the sign-in page and the static files.
pub fn is_open(path: &str) -> bool {
    path == "/console/login" || path.starts_with("/console/static/")
}

/// The token a console request carries in its cookie, if any.
pub fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// Whether a form post comes from a console page: a browser names the page's
/// origin in `Origin`, and it must be this server (`Host`). With the
/// cookie's `SameSite=Strict`, another site cannot act as the signed-in user.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        // Not a browser form (curl with a bearer token): nothing to forge.
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
    !host.is_empty() && origin_host == host
}

/// Where an unauthenticated console request is sent: the sign-in page, then
/// back to what it asked for.
pub fn sign_in(path_and_query: &str) -> Response {
    let next = if path_and_query.starts_with("/console") { path_and_query } else { "/console" };
    Redirect::to(&format!("/console/login?next={}", encode(next))).into_response()
}

fn templates() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        for (name, source) in [
            ("base.html", include_str!("templates/base.html")),
            ("login.html", include_str!("templates/login.html")),
            ("cluster.html", include_str!("templates/cluster.html")),
            ("workers.html", include_str!("templates/workers.html")),
            ("jobs.html", include_str!("templates/jobs.html")),
            ("job.html", include_str!("templates/job.html")),
            ("incidents.html", include_str!("templates/incidents.html")),
            ("queues.html", include_str!("templates/queues.html")),
            ("schedules.html", include_str!("templates/schedules.html")),
            ("workflows.html", include_str!("templates/workflows.html")),
            ("job_rows.html", include_str!("templates/job_rows.html")),
            ("error.html", include_str!("templates/error.html")),
        ] {
            env.add_template(name, source).expect("console templates compile");
        }
        env
    })
}

/// Renders `name` with the values every page has (this node, the viewer).
pub(super) fn render(ctx: &NodeContext, principal: Option<&Principal>, name: &str, page: Value) -> Response {
    let nav = match name {
        "cluster.html" => "cluster",
        "workers.html" => "workers",
        "jobs.html" | "job.html" => "jobs",
        "incidents.html" => "incidents",
        "queues.html" => "queues",
        "schedules.html" => "schedules",
        "workflows.html" => "workflows",
        _ => "",
    };
    let common = context! {
        nav => nav,
        node_id => ctx.topology.node_id,
        nodes => ctx.topology.cluster_size() as usize,
        viewer => principal.map(|p| p.name.clone()),
        signed_in => ctx.auth.enabled(),
        page => page,
    };
    match templates().get_template(name).and_then(|t| t.render(common)) {
        Ok(html) => Html(html).into_response(),
        Err(error) => {
            tracing::error!("console page {name} failed to render: {error:#}");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("the page {name} failed to render: {error}")).into_response()
        }
    }
}

/// A page saying what went wrong, with the status the gateway's answer maps to.
pub(super) fn failure(ctx: &NodeContext, principal: &Principal, what: &str, status: &tonic::Status) -> Response {
    let code = http_status(status.code());
    let page = context! { what => what, code => format!("{:?}", status.code()), message => status.message() };
    let mut response = render(ctx, Some(principal), "error.html", page);
    *response.status_mut() = code;
    response
}

fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable | Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(super) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("static/style.css"))
}

async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("static/console.js"))
}

#[derive(Deserialize, Default)]
struct Next {
    #[serde(default)]
    next: String,
}

async fn login_page(State(ctx): State<Arc<NodeContext>>, Query(next): Query<Next>) -> Response {
    let page = context! { next => next.next, error => Option::<String>::None };
    render(&ctx, None, "login.html", page)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
}

/// Whether the admin port serves TLS (the sign-in cookie is then `Secure`).
#[derive(Clone, Copy)]
pub struct AdminTls(pub bool);

/// Checks the token as the gateway would, then keeps it in an HttpOnly,
/// SameSite=Strict cookie scoped to `/console`.
async fn login(
    State(ctx): State<Arc<NodeContext>>,
    Extension(tls): Extension<AdminTls>,
    Form(form): Form<LoginForm>,
) -> Response {
    let token = form.token.trim();
    let valid_chars = token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b));
    let checked = if token.is_empty() || !valid_chars {
        Err("paste a bearer token: a secret from the tokens file or a JWT".to_string())
    } else {
        ctx.auth.authenticate(Some(&format!("Bearer {token}"))).map_err(|e| e.to_string())
    };
    if let Err(error) = checked {
        let page = context! { next => form.next, error => error };
        let mut response = render(&ctx, None, "login.html", page);
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return response;
    }
    let next = if form.next.starts_with("/console") && !form.next.starts_with("//") { &form.next } else { "/console" };
    let secure = if tls.0 { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict{secure}");
    ([(header::SET_COOKIE, cookie)], Redirect::to(next)).into_response()
}

async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_post_must_come_from_this_server() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers), "no Origin: not a browser form");
        headers.insert(header::HOST, "127.0.0.1:9600".parse().unwrap());
        headers.insert(header::ORIGIN, "http://127.0.0.1:9600".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(!same_origin(&headers));
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("a=1; {COOKIE}=drv_secret; b=2").parse().unwrap());
        assert_eq!(cookie_token(&headers).as_deref(), Some("drv_secret"));
        assert_eq!(cookie_token(&HeaderMap::new()), None);
    }

    #[test]
    fn sign_in_returns_only_to_console_pages() {
        let to = |r: Response| r.headers()[header::LOCATION].to_str().unwrap().to_string();
        assert_eq!(to(sign_in("/console/jobs?state=incident")), "/console/login?next=/console/jobs%3Fstate%3Dincident");
        assert_eq!(to(sign_in("https://evil.example")), "/console/login?next=/console");
    }

    #[test]
    fn every_template_compiles() {
        let env = templates();
        for name in ["login.html", "cluster.html", "workers.html", "jobs.html", "job.html", "incidents.html"] {
            env.get_template(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
