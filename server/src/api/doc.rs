//! The shapes every route shares (the success envelopes, the two error bodies) and the OpenAPI
//! document, derived from the handlers' own request and response types by utoipa.
//!
//! Each handler declares its path, parameters, body, success response and the errors only it
//! can answer (404, 409…); [`StandardErrors`] adds those that follow from how the operation is
//! called, so no operation can forget one: 401 and 429 where a credential is required, 422 where
//! there is a body or a parameter, 413 where there is a body, 500 and 503 everywhere.
use serde::Serialize;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, ToSchema};

use app::core::error::FieldError;

/// A success carrying one item or a list: `{"success": true, "data": …}`.
#[derive(Serialize, ToSchema)]
pub struct Data<T> {
    pub success: bool,
    pub data: T,
}

impl<T> Data<T> {
    pub fn new(data: T) -> axum::Json<Self> {
        axum::Json(Self {
            success: true,
            data,
        })
    }
}

/// A confirmation: `{"success": true, "message": …}`.
#[derive(Serialize, ToSchema)]
pub struct Message {
    pub success: bool,
    pub message: String,
}

impl Message {
    pub fn new(message: impl Into<String>) -> axum::Json<Self> {
        axum::Json(Self {
            success: true,
            message: message.into(),
        })
    }
}

/// Every error but validation: `{"success": false, "detail": "…"}`.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"success": false, "detail": "Memory not found"}))]
pub struct ErrorBody {
    /// Always false.
    pub success: bool,
    pub detail: String,
}

/// A validation error (422): every problem found, in FastAPI's shape.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"success": false, "detail": [
    {"loc": ["body", "content"], "msg": "Field required", "type": "missing", "input": {}}
]}))]
pub struct ValidationErrorBody {
    /// Always false.
    pub success: bool,
    pub detail: Vec<FieldError>,
}

/// The security scheme of `X-API-Key` routes.
pub const API_KEY: &str = "api_key";
/// The security scheme of the bearer (JWT) routes.
pub const BEARER: &str = "bearer";
/// An API key as a bearer token, as OpenAI's SDKs send theirs (the `openai` routes).
pub const BEARER_KEY: &str = "bearer_key";
/// Operations answering errors in OpenAI's shape, not ours.
pub const OPENAI_TAG: &str = "openai";

/// The document's own parts: title, description, security schemes, tags.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Engram API",
        description = "A self-hostable memory store for AI applications. Memories are queued \
            (`POST /api/v1/memories` answers a `task_id`), embedded and classified into a \
            cognitive sector by a worker, then found again by hybrid search. Errors are \
            `{\"success\": false, \"detail\": …}`; validation errors (422) carry FastAPI's \
            `[{loc, msg, type, input?, ctx?}]`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&SecuritySchemes, &StandardErrors),
    components(schemas(ErrorBody, ValidationErrorBody)),
    tags(
        (name = "accounts", description = "Sign-up, log-in (JWT) and the current user"),
        (name = "keys", description = "API keys, managed with a JWT"),
        (name = "projects", description = "Projects group memories; every account has `default`"),
        (name = "memories", description = "Queue, list, read, delete and search memories"),
        (name = "tasks", description = "Follow a queued memory (or batch) until it is stored"),
        (name = "agents", description = "Machine accounts: auto-registration, claims, statistics"),
        (name = "models", description = "The public catalogue of LLMs: context windows, prices, capabilities (no credential)"),
        (name = "conversations", description = "Chats stored message by message; user and assistant messages are remembered"),
        (name = "openai", description = "OpenAI-compatible routes: point an OpenAI SDK at `/api/v1` with an Engram key. Errors here are in OpenAI's shape, `{\"error\": {message, type, param, code}}`"),
        (name = "transfer", description = "An account's export and import, as JSON Lines"),
        (name = "stats", description = "An account's statistics, its plan and quotas (over a quota: 402), the billing webhook"),
        (name = "proxy", description = "The LLM proxy's upstream for this account"),
        (name = "memoryx", description = "The paths MemoryX's published SDKs call, over the same functions"),
        (name = "service", description = "Health and readiness")
    )
)]
pub struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            API_KEY,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "An API key (`engram_…`): create one in the portal or with `POST /api/keys`, or \
                 get one from `POST /api/v1/agents/auto-register`",
            ))),
        );
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("The `access_token` of `POST /api/auth/login`"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            BEARER_KEY,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("engram_…")
                    .description(Some("An API key as a bearer token (`Authorization: Bearer engram_…`), as OpenAI's SDKs send their `api_key`"))
                    .build(),
            ),
        );
    }
}

fn error_response(description: &str, schema: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(utoipa::openapi::Ref::from_schema_name(schema)))
                .build(),
        )
        .build()
        .into()
}

/// Adds the error responses that follow from how an operation is called (see the module doc).
pub struct StandardErrors;

impl Modify for StandardErrors {
    fn modify(&self, openapi: &mut OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
                let has_body = op.request_body.is_some();
                let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
                let openai = op
                    .tags
                    .as_ref()
                    .is_some_and(|t| t.iter().any(|t| t == OPENAI_TAG));
                let responses = &mut op.responses.responses;
                let mut add = |status: &str, description: &str, validation: bool| {
                    // OpenAI's routes answer every error in OpenAI's shape, a bad body as 400.
                    let schema = match (openai, validation) {
                        (true, true) => return,
                        (true, false) => "OpenAiErrorBody",
                        (false, true) => "ValidationErrorBody",
                        (false, false) => "ErrorBody",
                    };
                    responses
                        .entry(status.to_string())
                        .or_insert_with(|| error_response(description, schema));
                };
                // Work with an API key counts toward the plan's quotas.
                let keyed = op.security.as_ref().is_some_and(|s| {
                    let json = serde_json::to_string(s).unwrap_or_default();
                    json.contains(API_KEY) || json.contains(BEARER_KEY)
                });
                if keyed {
                    add(
                        "402",
                        "A quota of the account's plan is used up: `detail` names it, its use, its limit and the plan",
                        false,
                    );
                }
                if secured {
                    add("401", "Missing, malformed or revoked credential", false);
                    add("429", "Rate limit reached; see `Retry-After`", false);
                }
                if has_body {
                    add("413", "Request body over 1 MiB", false);
                }
                if has_body || has_params {
                    add("422", "Validation error", true);
                }
                add(
                    "500",
                    "Internal error (the cause is logged, never sent)",
                    false,
                );
                add(
                    "503",
                    "The database is unreachable; see `Retry-After`",
                    false,
                );
            }
        }
    }
}
