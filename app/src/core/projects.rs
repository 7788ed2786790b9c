//! Projects: every account has `default`; a project is named by its id or its name.
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::crypto;
use super::error::{is_unique_violation, AppError, AppResult};
use super::time::iso;
use crate::types::ProjectView;

/// The id (and name) of every account's default project.
pub const DEFAULT: &str = "default";

pub async fn create_default(db: impl PgExecutor<'_>, user_id: i64) -> AppResult<()> {
    sqlx::query("insert into projects (user_id, id, name) values ($1, 'default', 'default') on conflict do nothing").bind(user_id).execute(db).await?;
    Ok(())
}

/// The id of the account's project named by `id_or_name`; 404 when there is none.
pub async fn resolve(db: impl PgExecutor<'_>, user_id: i64, id_or_name: &str) -> AppResult<String> {
    let id: Option<String> = sqlx::query_scalar(
        "select id from projects where user_id = $1 and (id = $2 or name = $2) order by (id = $2) desc limit 1",
    )
    .bind(user_id)
    .bind(id_or_name)
    .fetch_optional(db)
    .await?;
    id.ok_or_else(|| AppError::not_found("Project"))
}

type Row = (String, String, Option<String>, DateTime<Utc>, i64);

fn view((id, name, description, created_at, memory_count): Row) -> ProjectView {
    ProjectView {
        id,
        name,
        description,
        created_at: iso(created_at),
        memory_count,
    }
}

const SELECT: &str = "select p.id, p.name, p.description, p.created_at,
    (select count(*) from memories m where m.user_id = p.user_id and m.project_id = p.id) as memory_count
    from projects p";

/// The account's projects, `default` first, then by creation.
pub async fn list(db: impl PgExecutor<'_>, user_id: i64) -> AppResult<Vec<ProjectView>> {
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{SELECT} where p.user_id = $1 order by (p.id = 'default') desc, p.created_at, p.id"
    )))
    .bind(user_id)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(view).collect())
}

pub async fn get(
    db: impl PgExecutor<'_>,
    user_id: i64,
    id_or_name: &str,
) -> AppResult<ProjectView> {
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} where p.user_id = $1 and (p.id = $2 or p.name = $2) order by (p.id = $2) desc limit 1")))
        .bind(user_id)
        .bind(id_or_name)
        .fetch_optional(db)
        .await?;
    row.map(view).ok_or_else(|| AppError::not_found("Project"))
}

/// Creates a project with a generated id; 409 when the account already has that name.
pub async fn create(
    db: impl PgExecutor<'_>,
    user_id: i64,
    name: &str,
    description: Option<&str>,
) -> AppResult<ProjectView> {
    let id = format!("proj_{}", crypto::random_token(12).to_lowercase());
    match sqlx::query_as::<_, (DateTime<Utc>,)>("insert into projects (user_id, id, name, description) values ($1, $2, $3, $4) returning created_at")
        .bind(user_id)
        .bind(&id)
        .bind(name)
        .bind(description)
        .fetch_one(db)
        .await
    {
        Ok((created_at,)) => Ok(ProjectView { id, name: name.into(), description: description.map(Into::into), created_at: iso(created_at), memory_count: 0 }),
        Err(e) if is_unique_violation(&e, "projects_user_name_key") => Err(AppError::Conflict(format!("A project named '{name}' already exists"))),
        Err(e) => Err(e.into()),
    }
}

/// Creates a project for a client (the API, the portal) if the plan's projects quota allows
/// one more (402 otherwise).
pub async fn create_for(
    state: &super::state::AppState,
    user_id: i64,
    name: &str,
    description: Option<&str>,
) -> AppResult<ProjectView> {
    use super::plans::Quota;
    let charge = state
        .quotas
        .charge(&state.pool, &state.stats, user_id, Quota::Projects, 1)
        .await?;
    let created = create(&state.pool, user_id, name, description).await?;
    charge.done();
    Ok(created)
}

/// Deletes a project with its memories and pending tasks; answers how many memories went.
/// The `default` project cannot be deleted (409).
pub async fn delete(
    pool: &sqlx::PgPool,
    user_id: i64,
    id_or_name: &str,
) -> AppResult<(String, i64)> {
    let mut tx = pool.begin().await?;
    let id = resolve(&mut *tx, user_id, id_or_name).await?;
    if id == DEFAULT {
        return Err(AppError::Conflict(
            "The default project cannot be deleted".into(),
        ));
    }
    let memories: i64 =
        sqlx::query_scalar("select count(*) from memories where user_id = $1 and project_id = $2")
            .bind(user_id)
            .bind(&id)
            .fetch_one(&mut *tx)
            .await?;
    // Memories and tasks go with the project (foreign keys cascade).
    sqlx::query("delete from projects where user_id = $1 and id = $2")
        .bind(user_id)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((id, memories))
}

/// A project to create: the body of `POST /api/v1/projects`.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[schema(as = CreateProjectRequest, example = json!({"name": "travel", "description": "Trips and bookings"}))]
pub struct NewProject {
    /// 1 to 64 characters after trimming, unique in the account (lowercase letters, digits and
    /// hyphens are recommended).
    #[schema(min_length = 1, max_length = 64)]
    pub name: String,
    #[schema(max_length = 1000)]
    pub description: Option<String>,
}

impl super::validate::FromFields for NewProject {
    fn from_fields(fields: &mut super::validate::Fields) -> Self {
        let name = fields.required_str("name", 1, 64);
        let description = fields
            .optional_str("description", 1000)
            .filter(|d| !d.is_empty());
        NewProject { name, description }
    }
}
