//! Export and import of an account as JSON Lines: a header, then its projects, conversations
//! (with their messages) and memories (content, metadata, sector, importance, timestamps, the
//! embedding model and the vector), one record a line.
//!
//! An import goes into one transaction: it lands whole or not at all. Projects are matched by
//! name (created when missing); conversations get new ids, and the memories' metadata is moved
//! to them, so a conversation's memories stay one stream. A memory embedded by the model this
//! server runs is stored as it is (vector, sector, importance and timestamps kept); any other is
//! queued through the normal pipeline.
use std::collections::HashMap;

use chrono::{DateTime, NaiveDate, Utc};
use pgvector::Vector;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::embed::MODEL_NAME;
use super::error::{AppError, AppResult, FieldError};
use super::memories::{self, NewMemory};

/// The format's version, in the header line.
pub const VERSION: u32 = 1;
/// Memories read per page while exporting, and written per statement while importing.
const PAGE: i64 = 500;

/// One line of an export.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    Header {
        version: u32,
        exported_at: DateTime<Utc>,
        email: Option<String>,
    },
    Project {
        id: String,
        name: String,
        description: Option<String>,
        created_at: DateTime<Utc>,
    },
    Conversation {
        id: Uuid,
        project_id: String,
        title: Option<String>,
        external_id: Option<String>,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        messages: Vec<Message>,
    },
    Memory {
        id: Uuid,
        project_id: String,
        content: String,
        metadata: Option<Value>,
        agent_id: Option<String>,
        cognitive_sector: String,
        importance_score: f32,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        event_day: NaiveDate,
        embedding_model: String,
        embedding: Option<Vec<f32>>,
    },
}

/// A conversation's message in an export.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    pub id: Uuid,
    pub role: String,
    pub content: String,
    pub name: Option<String>,
    pub tokens: Option<i32>,
    pub sent_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

fn to_line(v: &Line) -> String {
    let mut s = serde_json::to_string(v).expect("an export line serialises");
    s.push('\n');
    s
}

/// Where an export has got to.
pub enum Stage {
    Start,
    /// Memories after this (stored at, stream position): the order they were stored in, on
    /// the account's `created_at` index.
    Memories {
        after: Option<(DateTime<Utc>, i64)>,
    },
    Done,
}

type MemoryRow = (
    Uuid,
    String,
    String,
    Option<sqlx::types::Json<Value>>,
    Option<String>,
    String,
    f32,
    DateTime<Utc>,
    DateTime<Utc>,
    NaiveDate,
    String,
    Vector,
    i64,
);

/// The next chunk of the account's export (many lines), and the stage after it; `None` at
/// the end. Projects and conversations come in the first chunk, memories a page at a time in
/// the order they were stored (memories stored together in their submission order).
pub async fn next_chunk(
    pool: &PgPool,
    user_id: i64,
    email: Option<&str>,
    stage: Stage,
) -> AppResult<Option<(String, Stage)>> {
    match stage {
        Stage::Done => Ok(None),
        Stage::Start => {
            let mut out = to_line(&Line::Header {
                version: VERSION,
                exported_at: Utc::now(),
                email: email.map(str::to_string),
            });
            let projects: Vec<(String, String, Option<String>, DateTime<Utc>)> = sqlx::query_as(
                "select id, name, description, created_at from projects where user_id = $1 order by created_at, id",
            )
            .bind(user_id)
            .fetch_all(pool)
            .await?;
            for (id, name, description, created_at) in projects {
                out.push_str(&to_line(&Line::Project {
                    id,
                    name,
                    description,
                    created_at,
                }));
            }
            type Conv = (
                Uuid,
                String,
                Option<String>,
                Option<String>,
                DateTime<Utc>,
                DateTime<Utc>,
            );
            let conversations: Vec<Conv> = sqlx::query_as(
                "select id, project_id, title, external_id, created_at, updated_at from conversations
                 where user_id = $1 order by created_at, id",
            )
            .bind(user_id)
            .fetch_all(pool)
            .await?;
            for (id, project_id, title, external_id, created_at, updated_at) in conversations {
                type Msg = (
                    Uuid,
                    String,
                    String,
                    Option<String>,
                    Option<i32>,
                    Option<DateTime<Utc>>,
                    DateTime<Utc>,
                );
                let rows: Vec<Msg> = sqlx::query_as(
                    "select id, role, content, name, tokens, sent_at, created_at from conversation_messages
                     where conversation_id = $1 order by position",
                )
                .bind(id)
                .fetch_all(pool)
                .await?;
                let messages = rows
                    .into_iter()
                    .map(
                        |(id, role, content, name, tokens, sent_at, created_at)| Message {
                            id,
                            role,
                            content,
                            name,
                            tokens,
                            sent_at,
                            created_at,
                        },
                    )
                    .collect();
                out.push_str(&to_line(&Line::Conversation {
                    id,
                    project_id,
                    title,
                    external_id,
                    created_at,
                    updated_at,
                    messages,
                }));
            }
            Ok(Some((out, Stage::Memories { after: None })))
        }
        Stage::Memories { after } => {
            let rows: Vec<MemoryRow> = sqlx::query_as(
                "select id, project_id, content, metadata, agent_id, cognitive_sector, importance_score,
                        created_at, updated_at, event_day, embedding_model, embedding, seq
                 from memories where user_id = $1
                   and ($2::timestamptz is null or (created_at, seq) > ($2, $3))
                 order by created_at, seq limit $4",
            )
            .bind(user_id)
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(PAGE)
            .fetch_all(pool)
            .await?;
            if rows.is_empty() {
                return Ok(None);
            }
            let last = rows.last().map(|r| (r.7, r.12));
            let full = rows.len() as i64 == PAGE;
            let mut out = String::new();
            for (
                id,
                project_id,
                content,
                metadata,
                agent_id,
                sector,
                importance,
                created_at,
                updated_at,
                event_day,
                model,
                embedding,
                _seq,
            ) in rows
            {
                out.push_str(&to_line(&Line::Memory {
                    id,
                    project_id,
                    content,
                    metadata: metadata.map(|m| m.0),
                    agent_id,
                    cognitive_sector: sector,
                    importance_score: importance,
                    created_at,
                    updated_at,
                    event_day,
                    embedding_model: model,
                    embedding: Some(embedding.to_vec()),
                }));
            }
            let next = if full {
                Stage::Memories { after: last }
            } else {
                Stage::Done
            };
            Ok(Some((out, next)))
        }
    }
}

/// What an import did.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ImportReport {
    pub projects_created: u64,
    pub projects_matched: u64,
    pub conversations: u64,
    pub messages: u64,
    /// Stored as exported, vectors included.
    pub memories_kept: u64,
    /// Queued for embedding (another model's vectors, or none).
    pub memories_queued: u64,
}

/// An import under way: one transaction.
pub struct Import<'a> {
    tx: sqlx::Transaction<'a, sqlx::Postgres>,
    user_id: i64,
    /// Exported project id → this account's.
    projects: HashMap<String, String>,
    conversations: HashMap<String, Uuid>,
    messages: HashMap<String, Uuid>,
    /// Memories waiting to be written together.
    kept: Vec<Line>,
    queued: HashMap<String, Vec<NewMemory>>,
    lines: usize,
    pub report: ImportReport,
}

/// A refused line: 422 naming it (1-based).
fn bad_line(n: usize, msg: impl Into<String>) -> AppError {
    AppError::validation(
        FieldError::new(&["body"], "value_error", msg).ctx(serde_json::json!({"line": n})),
    )
}

impl<'a> Import<'a> {
    pub async fn begin(pool: &'a PgPool, user_id: i64) -> AppResult<Self> {
        Ok(Self {
            tx: pool.begin().await?,
            user_id,
            projects: HashMap::new(),
            conversations: HashMap::new(),
            messages: HashMap::new(),
            kept: vec![],
            queued: HashMap::new(),
            lines: 0,
            report: ImportReport::default(),
        })
    }

    /// Reads one line of an export (blank lines are skipped).
    pub async fn line(&mut self, text: &str) -> AppResult<()> {
        self.lines += 1;
        let n = self.lines;
        if text.trim().is_empty() {
            return Ok(());
        }
        if text.contains('\0') || text.contains("\\u0000") {
            return Err(bad_line(
                n,
                "Value error, a NUL character (U+0000) cannot be stored",
            ));
        }
        let parsed: Line = serde_json::from_str(text).map_err(|e| {
            bad_line(
                n,
                format!("Value error, line {n} is not an export record: {e}"),
            )
        })?;
        match parsed {
            Line::Header { version, .. } if version != VERSION => Err(bad_line(
                n,
                format!("Value error, export version {version} is not {VERSION}"),
            )),
            Line::Header { .. } => Ok(()),
            Line::Project {
                id,
                name,
                description,
                ..
            } => {
                let existing: Option<String> = sqlx::query_scalar(
                    "select id from projects where user_id = $1 and (name = $2 or ($3 = 'default' and id = 'default'))
                     order by (id = 'default') desc limit 1",
                )
                .bind(self.user_id)
                .bind(&name)
                .bind(&id)
                .fetch_optional(&mut *self.tx)
                .await?;
                let mine = match existing {
                    Some(p) => {
                        self.report.projects_matched += 1;
                        p
                    }
                    None => {
                        let name: String = name.chars().take(64).collect();
                        let created = super::projects::create(
                            &mut *self.tx,
                            self.user_id,
                            &name,
                            description.as_deref(),
                        )
                        .await
                        .map_err(|e| {
                            bad_line(
                                n,
                                format!("Value error, project {name:?}: {}", e.user_message()),
                            )
                        })?;
                        self.report.projects_created += 1;
                        created.id
                    }
                };
                self.projects.insert(id, mine);
                Ok(())
            }
            Line::Conversation {
                id,
                project_id,
                title,
                external_id,
                created_at,
                updated_at,
                messages,
            } => {
                let project = self.project(n, &project_id)?;
                for m in &messages {
                    if !super::conversations::ROLES.contains(&m.role.as_str()) {
                        return Err(bad_line(
                            n,
                            format!("Value error, unknown role {:?}", m.role),
                        ));
                    }
                }
                let inserted: Option<Uuid> = sqlx::query_scalar(
                    "insert into conversations (id, user_id, project_id, external_id, title, message_count, created_at, updated_at)
                     values ($1, $2, $3, $4, $5, $6, $7, $8)
                     on conflict (user_id, external_id) do nothing returning id",
                )
                .bind(Uuid::new_v4())
                .bind(self.user_id)
                .bind(&project)
                .bind(&external_id)
                .bind(&title)
                .bind(messages.len() as i32)
                .bind(created_at)
                .bind(updated_at)
                .fetch_optional(&mut *self.tx)
                .await?;
                let Some(new_id) = inserted else {
                    // The account has a conversation with this client id already (an export
                    // imported twice): its memories join that one; its messages stay as they are.
                    let existing: Uuid = sqlx::query_scalar(
                        "select id from conversations where user_id = $1 and external_id = $2",
                    )
                    .bind(self.user_id)
                    .bind(&external_id)
                    .fetch_one(&mut *self.tx)
                    .await?;
                    self.conversations.insert(id.to_string(), existing);
                    return Ok(());
                };
                let mut ids = vec![];
                for m in &messages {
                    let mid = Uuid::new_v4();
                    self.messages.insert(m.id.to_string(), mid);
                    ids.push(mid);
                }
                sqlx::query(
                    "insert into conversation_messages (id, conversation_id, position, role, content, name, tokens, sent_at, created_at)
                     select m.id, $2, m.ord::int, m.role, m.content, m.name, m.tokens, m.sent_at, m.created_at
                     from unnest($1::uuid[], $3::text[], $4::text[], $5::text[], $6::int[], $7::timestamptz[], $8::timestamptz[])
                          with ordinality as m(id, role, content, name, tokens, sent_at, created_at, ord)",
                )
                .bind(&ids)
                .bind(new_id)
                .bind(messages.iter().map(|m| m.role.clone()).collect::<Vec<_>>())
                .bind(messages.iter().map(|m| m.content.clone()).collect::<Vec<_>>())
                .bind(messages.iter().map(|m| m.name.clone()).collect::<Vec<_>>())
                .bind(messages.iter().map(|m| m.tokens).collect::<Vec<_>>())
                .bind(messages.iter().map(|m| m.sent_at).collect::<Vec<_>>())
                .bind(messages.iter().map(|m| m.created_at).collect::<Vec<_>>())
                .execute(&mut *self.tx)
                .await?;
                self.conversations.insert(id.to_string(), new_id);
                self.report.conversations += 1;
                self.report.messages += messages.len() as u64;
                Ok(())
            }
            Line::Memory {
                ref project_id,
                ref content,
                ref embedding,
                ref embedding_model,
                ref metadata,
                ..
            } => {
                if content.trim().is_empty() || content.chars().count() > 32_768 {
                    return Err(bad_line(
                        n,
                        "Value error, a memory's content must be 1 to 32,768 characters",
                    ));
                }
                if !matches!(metadata, None | Some(Value::Null) | Some(Value::Object(_))) {
                    return Err(bad_line(
                        n,
                        "Value error, a memory's metadata must be an object or null",
                    ));
                }
                let project = self.project(n, project_id)?;
                let keep = embedding_model == MODEL_NAME
                    && embedding
                        .as_ref()
                        .is_some_and(|e| e.len() == super::embed::DIM);
                let mut memory = parsed.clone();
                if let Line::Memory {
                    project_id,
                    metadata,
                    ..
                } = &mut memory
                {
                    *project_id = project;
                    self.remap(metadata);
                }
                if keep {
                    self.kept.push(memory);
                    if self.kept.len() as i64 >= PAGE {
                        self.write_kept().await?;
                    }
                } else if let Line::Memory {
                    project_id,
                    content,
                    metadata,
                    agent_id,
                    ..
                } = memory
                {
                    self.queued
                        .entry(project_id.clone())
                        .or_default()
                        .push(NewMemory {
                            content,
                            project: project_id,
                            metadata,
                            agent_id,
                        });
                }
                Ok(())
            }
        }
    }

    fn project(&self, n: usize, exported: &str) -> AppResult<String> {
        self.projects.get(exported).cloned().ok_or_else(|| {
            bad_line(
                n,
                format!("Value error, project {exported:?} is not in the export before this line"),
            )
        })
    }

    /// The conversation and message a memory's metadata names, as imported.
    fn remap(&self, metadata: &mut Option<Value>) {
        let Some(Value::Object(m)) = metadata else {
            return;
        };
        for (key, map) in [
            ("conversation_id", &self.conversations),
            ("message_id", &self.messages),
        ] {
            if let Some(new) = m
                .get(key)
                .and_then(Value::as_str)
                .and_then(|old| map.get(old))
            {
                m.insert(key.into(), Value::String(new.to_string()));
            }
        }
    }

    async fn write_kept(&mut self) -> AppResult<()> {
        let batch = std::mem::take(&mut self.kept);
        if batch.is_empty() {
            return Ok(());
        }
        let mut cols = KeptColumns::default();
        for l in batch {
            if let Line::Memory {
                project_id,
                content,
                metadata,
                agent_id,
                cognitive_sector,
                importance_score,
                created_at,
                updated_at,
                event_day,
                embedding,
                ..
            } = l
            {
                cols.projects.push(project_id);
                cols.contents.push(content);
                cols.metadata
                    .push(sqlx::types::Json(metadata.unwrap_or(Value::Null)));
                cols.agents.push(agent_id);
                cols.sectors.push(cognitive_sector);
                cols.importances.push(importance_score.clamp(0.0, 1.0));
                cols.created.push(created_at);
                cols.updated.push(updated_at);
                cols.days.push(event_day);
                cols.vectors
                    .push(Vector::from(embedding.unwrap_or_default()));
            }
        }
        let n = cols.contents.len() as u64;
        // In order: the memories keep their stream order (`seq`).
        sqlx::query(
            "insert into memories (id, user_id, project_id, content, metadata, agent_id, cognitive_sector,
                 importance_score, embedding, embedding_model, created_at, updated_at, event_day)
             select gen_random_uuid(), $1, project_id, content, nullif(metadata, 'null'::jsonb), agent_id, sector, importance,
                 embedding, $11, created_at, updated_at, event_day
             from unnest($2::text[], $3::text[], $4::jsonb[], $5::text[], $6::text[], $7::real[], $8::vector[],
                         $9::timestamptz[], $10::timestamptz[], $12::date[])
                  with ordinality as b(project_id, content, metadata, agent_id, sector, importance, embedding,
                                       created_at, updated_at, event_day, ord)
             order by ord",
        )
        .bind(self.user_id)
        .bind(&cols.projects)
        .bind(&cols.contents)
        .bind(&cols.metadata)
        .bind(&cols.agents)
        .bind(&cols.sectors)
        .bind(&cols.importances)
        .bind(&cols.vectors)
        .bind(&cols.created)
        .bind(&cols.updated)
        .bind(MODEL_NAME)
        .bind(&cols.days)
        .execute(&mut *self.tx)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23514") => {
                bad_line(self.lines, "Value error, a memory's sector is not one of the five")
            }
            _ => e.into(),
        })?;
        self.report.memories_kept += n;
        Ok(())
    }

    /// The memories the import adds (stored with their vectors, or queued).
    pub fn memory_count(&self) -> usize {
        self.report.memories_kept as usize
            + self.kept.len()
            + self.queued.values().map(Vec::len).sum::<usize>()
    }

    /// Writes what is waiting and commits: the whole import, or nothing.
    pub async fn commit(mut self) -> AppResult<ImportReport> {
        self.write_kept().await?;
        for (project, batch) in std::mem::take(&mut self.queued) {
            for chunk in batch.chunks(memories::MAX_BATCH) {
                self.report.memories_queued += chunk.len() as u64;
                memories::enqueue_in(&mut self.tx, self.user_id, &project, chunk.to_vec(), false)
                    .await?;
            }
        }
        self.tx.commit().await?;
        Ok(self.report)
    }
}

#[derive(Default)]
struct KeptColumns {
    projects: Vec<String>,
    contents: Vec<String>,
    metadata: Vec<sqlx::types::Json<Value>>,
    agents: Vec<Option<String>>,
    sectors: Vec<String>,
    importances: Vec<f32>,
    created: Vec<DateTime<Utc>>,
    updated: Vec<DateTime<Utc>>,
    days: Vec<NaiveDate>,
    vectors: Vec<Vector>,
}
