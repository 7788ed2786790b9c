//! `/api/v1/agents/*`: machine accounts and claims.
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::doc::{Data, ErrorBody};
use super::extract::{ApiKeyAuth, Body, ClientIp, Query};
use app::core::claims::{self, ClaimStarted};
use app::core::error::AppResult;
use app::core::machines::{self, MachineAccount, MachineStats};
use app::core::state::AppState;
use app::core::validate::{email_problem, Fields, FromFields};

/// A machine registering itself.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"machine_fingerprint": "3f0c2a9b8d7e6f5a4b3c2d1e0f9a8b7c", "platform": "linux", "hostname": "build-box"}))]
pub struct AutoRegisterRequest {
    /// 16 to 256 characters of `[A-Za-z0-9._:-]`, stable for the machine.
    #[schema(min_length = 16, max_length = 256, pattern = "^[A-Za-z0-9._:-]+$")]
    pub machine_fingerprint: String,
    #[schema(value_type = Option<String>, nullable, pattern = "^(macos|linux|windows)$")]
    pub platform: Option<String>,
    #[schema(max_length = 255)]
    pub hostname: Option<String>,
}

impl FromFields for AutoRegisterRequest {
    fn from_fields(f: &mut Fields) -> Self {
        AutoRegisterRequest {
            machine_fingerprint: machines::read_fingerprint(f),
            platform: f.optional_enum("platform", &machines::PLATFORMS),
            hostname: f.optional_str("hostname", 255).filter(|h| !h.is_empty()),
        }
    }
}

/// Registers (or finds) the machine and issues it a new key: the REST route and MemoryX's share it.
pub async fn register_machine(
    state: &AppState,
    client: &str,
    req: &AutoRegisterRequest,
) -> AppResult<MachineAccount> {
    state
        .limiter
        .hit(
            &format!("auto-register:{client}"),
            state.settings.limits.auto_register_per_hour,
            Duration::from_secs(3600),
        )
        .await?;
    machines::auto_register(
        &state.pool,
        &req.machine_fingerprint,
        req.platform.as_deref(),
        req.hostname.as_deref(),
    )
    .await
}

#[utoipa::path(post, path = "/api/v1/agents/auto-register", tag = "agents",
    request_body = AutoRegisterRequest,
    responses(
        (status = 200, description = "The machine account and a new key for it", body = Data<MachineAccount>),
        (status = 409, description = "The machine was claimed: use the account's own keys", body = ErrorBody),
        (status = 429, description = "Too many registrations from this address; see `Retry-After`", body = ErrorBody),
    ))]
/// Register this machine as a machine account (or add a key to it): all agents on the machine
/// share one pool of memories.
pub async fn auto_register(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    Body(req): Body<AutoRegisterRequest>,
) -> AppResult<Json<Data<MachineAccount>>> {
    Ok(Data::new(register_machine(&state, &client, &req).await?))
}

/// The machine named.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MachineQuery {
    /// The fingerprint the machine registered with.
    #[param(min_length = 16, max_length = 256, pattern = "^[A-Za-z0-9._:-]+$")]
    pub machine_fingerprint: String,
}

impl FromFields for MachineQuery {
    fn from_fields(f: &mut Fields) -> Self {
        MachineQuery {
            machine_fingerprint: machines::read_fingerprint(f),
        }
    }
}

#[utoipa::path(get, path = "/api/v1/agents/machine-stats", tag = "agents",
    security(("api_key" = [])),
    params(MachineQuery),
    responses(
        (status = 200, description = "The machine's figures", body = Data<MachineStats>),
        (status = 404, description = "Not the key's machine", body = ErrorBody),
    ))]
/// A machine's memories, projects, API calls in the last 24 hours and storage.
pub async fn machine_stats(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Query(q): Query<MachineQuery>,
) -> AppResult<Json<Data<MachineStats>>> {
    Ok(Data::new(
        machines::stats(&state.pool, &state.usage, owner, &q.machine_fingerprint).await?,
    ))
}

/// A claim of a machine by the human named.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"machine_fingerprint": "3f0c2a9b8d7e6f5a4b3c2d1e0f9a8b7c", "email": "ana@example.com"}))]
pub struct ClaimInitRequest {
    #[schema(min_length = 16, max_length = 256, pattern = "^[A-Za-z0-9._:-]+$")]
    pub machine_fingerprint: String,
    /// The e-mail of an existing human account: the code is sent there.
    #[schema(format = "email", max_length = 254)]
    pub email: String,
}

impl FromFields for ClaimInitRequest {
    fn from_fields(f: &mut Fields) -> Self {
        let machine_fingerprint = machines::read_fingerprint(f);
        let email = f.required_str("email", 1, 254).to_lowercase();
        if !email.is_empty() {
            if let Some(problem) = email_problem(&email) {
                f.error("email", "value_error", problem, None);
            }
        }
        ClaimInitRequest {
            machine_fingerprint,
            email,
        }
    }
}

/// A claim started.
#[derive(Serialize, ToSchema)]
pub struct ClaimInitiated {
    pub success: bool,
    pub data: ClaimStarted,
    pub message: String,
}

#[utoipa::path(post, path = "/api/v1/agents/claim/init", tag = "agents",
    request_body = ClaimInitRequest,
    responses(
        (status = 200, description = "A 6-digit code was e-mailed (and shown only without a mail transport)", body = ClaimInitiated),
        (status = 404, description = "Unknown machine or e-mail", body = ErrorBody),
        (status = 409, description = "The machine is already claimed", body = ErrorBody),
        (status = 429, description = "Too many claims started for the machine or the e-mail this hour, or too many wrong codes today", body = ErrorBody),
    ))]
/// Start claiming a machine account into a human account: e-mails a 6-digit code.
pub async fn claim_init(
    State(state): State<AppState>,
    Body(req): Body<ClaimInitRequest>,
) -> AppResult<Json<ClaimInitiated>> {
    let started = claims::init(
        &state.pool,
        &state.settings,
        &req.machine_fingerprint,
        &req.email,
    )
    .await?;
    Ok(Json(ClaimInitiated {
        success: true,
        data: started,
        message: "Verification code sent by e-mail".into(),
    }))
}

/// The code the human received.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"machine_fingerprint": "3f0c2a9b8d7e6f5a4b3c2d1e0f9a8b7c", "verification_code": "123456"}))]
pub struct ClaimVerifyRequest {
    #[schema(min_length = 16, max_length = 256, pattern = "^[A-Za-z0-9._:-]+$")]
    pub machine_fingerprint: String,
    #[schema(min_length = 6, max_length = 6, pattern = "^[0-9]{6}$")]
    pub verification_code: String,
}

impl FromFields for ClaimVerifyRequest {
    fn from_fields(f: &mut Fields) -> Self {
        let machine_fingerprint = machines::read_fingerprint(f);
        let code = f.required_str("verification_code", 6, 6);
        if code.len() == 6 && !code.chars().all(|c| c.is_ascii_digit()) {
            f.error(
                "verification_code",
                "string_pattern_mismatch",
                "String should match pattern '^[0-9]{6}$'",
                Some(json!({"pattern": "^[0-9]{6}$"})),
            );
        }
        ClaimVerifyRequest {
            machine_fingerprint,
            verification_code: code,
        }
    }
}

/// The merge's result.
#[derive(Serialize, ToSchema)]
pub struct ClaimMerged {
    pub message: String,
    /// The human account's id.
    pub merged_to_user_id: String,
}

#[utoipa::path(post, path = "/api/v1/agents/claim/verify", tag = "agents",
    request_body = ClaimVerifyRequest,
    responses(
        (status = 200, description = "Merged: the machine's projects, memories and keys moved", body = Data<ClaimMerged>),
        (status = 400, description = "Invalid or expired verification code", body = ErrorBody),
        (status = 404, description = "Unknown machine", body = ErrorBody),
        (status = 429, description = "Too many wrong codes (5 void the claim; the day's limit per machine and per e-mail refuses every code until it passes)", body = ErrorBody),
    ))]
/// Finish a claim with the e-mailed code.
pub async fn claim_verify(
    State(state): State<AppState>,
    Body(req): Body<ClaimVerifyRequest>,
) -> AppResult<Json<Data<ClaimMerged>>> {
    let human = claims::verify(
        &state,
        claims::ClaimRef::Fingerprint(&req.machine_fingerprint),
        &req.verification_code,
    )
    .await?;
    Ok(Data::new(ClaimMerged {
        message: "Machine account merged into your account".into(),
        merged_to_user_id: human.to_string(),
    }))
}
