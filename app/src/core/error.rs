//! The one error type users can see, rendered once as the contract's JSON body.
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Value};

/// One FastAPI-shaped validation error: `{loc, msg, type, input?, ctx?}`.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
#[schema(example = json!({"loc": ["body", "content"], "msg": "Field required", "type": "missing", "input": {}}))]
pub struct FieldError {
    /// Where: `body`, `query`, `path` or `header`, then the field's name (or a position).
    #[schema(value_type = Vec<LocItem>)]
    pub loc: Vec<Value>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The value that was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub input: Option<Value>,
    /// The rule's parameters (`min_length`, `le`…).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub ctx: Option<Value>,
}

/// A step of a validation error's location: a name or a position.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum LocItem {
    Name(String),
    Index(i64),
}

impl FieldError {
    pub fn new(loc: &[&str], kind: &str, msg: impl Into<String>) -> Self {
        Self {
            loc: loc.iter().map(|s| Value::from(*s)).collect(),
            msg: msg.into(),
            kind: kind.into(),
            input: None,
            ctx: None,
        }
    }
    pub fn input(mut self, input: Value) -> Self {
        self.input = Some(input);
        self
    }
    pub fn ctx(mut self, ctx: Value) -> Self {
        self.ctx = Some(ctx);
        self
    }
    /// The last element of `loc`, the field's name, for showing an error next to a form field.
    pub fn field(&self) -> String {
        self.loc
            .last()
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    }
}

/// Every failure a handler can answer with. Internal causes are logged, never sent.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("request body too large")]
    PayloadTooLarge,
    /// A quota of the account's plan would be exceeded (402); the message names the quota, the
    /// use, the limit and the plan.
    #[error("{0}")]
    PaymentRequired(String),
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_secs: u64,
    },
    #[error("database unavailable")]
    Unavailable,
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

pub type AppResult<T> = Result<T, AppError>;

impl AppError {
    pub fn validation(err: FieldError) -> Self {
        AppError::Validation(vec![err])
    }
    pub fn not_found(what: &str) -> Self {
        AppError::NotFound(format!("{what} not found"))
    }
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Conflict(_) => StatusCode::CONFLICT,
            AppError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            AppError::PaymentRequired(_) => StatusCode::PAYMENT_REQUIRED,
            AppError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            AppError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    /// The `detail` of the body: an array for validation errors, a sentence otherwise.
    pub fn detail(&self) -> Value {
        match self {
            AppError::Validation(errors) => json!(errors),
            AppError::Internal(_) => json!("Internal server error"),
            AppError::Unavailable => {
                json!("Service temporarily unavailable: the database cannot be reached")
            }
            AppError::PayloadTooLarge => json!("Request body too large (limit 1 MiB)"),
            other => json!(other.to_string()),
        }
    }
    /// A one-line message for a portal page.
    pub fn user_message(&self) -> String {
        match self {
            AppError::Validation(errors) => {
                errors.first().map(|e| e.msg.clone()).unwrap_or_default()
            }
            other => other.detail().as_str().unwrap_or_default().to_string(),
        }
    }
}

impl From<sqlx::Error> for AppError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                tracing::error!(error = %err, "database unreachable");
                AppError::Unavailable
            }
            // The server is shutting down, restarting or not yet accepting connections
            // (class 57P: admin or crash shutdown, cannot connect now), or the connection
            // failed (class 08): the same outage, seen from a statement already under way.
            sqlx::Error::Database(db)
                if db
                    .code()
                    .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")) =>
            {
                tracing::error!(error = %err, "database unavailable");
                AppError::Unavailable
            }
            // Text PostgreSQL cannot store (a NUL character) that reached a query without a
            // field's rule catching it, such as a path segment: the client's input, not our fault.
            sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("22021") | Some("22P05")) =>
            {
                AppError::BadRequest(
                    "The request contains a NUL character (U+0000), which cannot be stored".into(),
                )
            }
            _ => AppError::Internal(anyhow::Error::new(err)),
        }
    }
}

/// Whether `err` is a unique violation of the named constraint.
pub fn is_unique_violation(err: &sqlx::Error, constraint: &str) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") && db.constraint() == Some(constraint))
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let AppError::Internal(cause) = &self {
            tracing::error!(error = ?cause, "internal error");
        }
        let mut response = (
            status,
            axum::Json(json!({"success": false, "detail": self.detail()})),
        )
            .into_response();
        let headers = response.headers_mut();
        match &self {
            AppError::RateLimited {
                retry_after_secs, ..
            } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            }
            AppError::Unavailable => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            _ => {}
        }
        response
    }
}
