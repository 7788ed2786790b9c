//! Conversations: an account's chats, stored message by message. User and assistant messages are
//! also remembered: each becomes a task (and then a memory) in the same transaction as the
//! message rows, with metadata naming the conversation, the message and the role, so that a
//! conversation's turns are one stream for search's neighbour context (the memories' `stream`
//! column). System and tool messages are stored only.
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::error::{AppError, AppResult};
use super::memories::{self, NewMemory};
use super::time::{iso, iso_opt};
use super::validate::{Fields, FromFields};
use crate::types::{ConversationView, MessageView};

/// The roles a message may have.
pub const ROLES: [&str; 4] = ["user", "assistant", "system", "tool"];
/// The roles whose messages are remembered.
pub const REMEMBERED: [&str; 2] = ["user", "assistant"];
/// Most messages appended in one call.
pub const MAX_MESSAGES: usize = 100;
/// Longest message, as for a memory.
pub const MAX_CONTENT: usize = 32_768;
/// A conversation without a title is named after its first user message, this long at most.
const TITLE_FROM_MESSAGE: usize = 80;

/// A message to append: an item of `messages`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"role": "user", "content": "I moved to Lisbon last spring",
    "timestamp": "2026-11-24T10:15:00Z"}))]
pub struct NewMessage {
    /// `user`, `assistant`, `system` or `tool`.
    #[schema(value_type = crate::core::conversations::Role)]
    pub role: String,
    /// The text, 1 to 32,768 characters after trimming.
    #[schema(min_length = 1, max_length = 32768)]
    pub content: String,
    /// The author's name (OpenAI's `name`).
    #[schema(max_length = 128)]
    pub name: Option<String>,
    /// When it was sent: RFC 3339, or milliseconds since the epoch (MemoryX's clients).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub timestamp: Option<DateTime<Utc>>,
    /// Its length in tokens, as the client counted it.
    #[schema(minimum = 0, maximum = 10000000)]
    pub tokens: Option<i32>,
}

/// A message's role.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum Role {
    User,
    Assistant,
    System,
    Tool,
}

impl FromFields for NewMessage {
    fn from_fields(f: &mut Fields) -> Self {
        let role = match f.raw("role") {
            None | Some(Value::Null) => {
                f.error("role", "missing", "Field required", None);
                String::new()
            }
            _ => f.optional_enum("role", &ROLES).unwrap_or_default(),
        };
        let content = f.required_str("content", 1, MAX_CONTENT);
        let name = f.optional_str("name", 128).filter(|n| !n.is_empty());
        let timestamp = read_timestamp(f, "timestamp");
        let tokens = f
            .optional_number("tokens", 0.0, 10_000_000.0)
            .filter(|t| t.fract() == 0.0)
            .map(|t| t as i32);
        NewMessage {
            role,
            content,
            name,
            timestamp,
            tokens,
        }
    }
}

/// RFC 3339 text, or a number of milliseconds since the epoch.
fn read_timestamp(f: &mut Fields, field: &str) -> Option<DateTime<Utc>> {
    let parsed = match f.raw(field)? {
        Value::Null => return None,
        Value::String(s) => DateTime::parse_from_rfc3339(s.trim())
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        Value::Number(n) => n
            .as_f64()
            .filter(|ms| (0.0..253_402_300_800_000.0).contains(ms))
            .and_then(|ms| DateTime::from_timestamp_millis(ms as i64)),
        _ => None,
    };
    if parsed.is_none() {
        f.error(
            field,
            "datetime_parsing",
            "Input should be an RFC 3339 date-time or milliseconds since 1970",
            None,
        );
    }
    parsed
}

/// Reads the `messages` list of a request: 1 to [`MAX_MESSAGES`] messages.
pub fn read_messages(f: &mut Fields) -> Vec<NewMessage> {
    let items = f.list("messages", 1, MAX_MESSAGES).unwrap_or_default();
    items
        .into_iter()
        .enumerate()
        .filter_map(|(i, item)| f.item::<NewMessage>("messages", i, item))
        .collect()
}

/// Which conversation to append to.
#[derive(Debug, Clone)]
pub enum Target {
    /// One of the account's, by id: 404 when there is none.
    Id(Uuid),
    /// The conversation with this client id, created in `project` when there is none.
    External { id: String, project: String },
    /// A new conversation with this id (made by the caller, so it can be answered before the
    /// messages are written), in `project`; appended to if it exists already.
    New { id: Uuid, project: String },
}

/// What an append wrote.
#[derive(Debug, Clone)]
pub struct Appended {
    pub conversation_id: Uuid,
    pub message_ids: Vec<Uuid>,
    /// Per message: its task, for user and assistant messages.
    pub task_ids: Vec<Option<Uuid>>,
    /// The batch's task, when asked for one.
    pub batch_id: Option<Uuid>,
}

/// Creates a conversation in `project` (the account's project's id or name).
pub async fn create(
    pool: &PgPool,
    user_id: i64,
    project: &str,
    title: Option<&str>,
) -> AppResult<ConversationView> {
    let project_id = super::projects::resolve(pool, user_id, project).await?;
    let row: ConversationRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "insert into conversations (id, user_id, project_id, title) values ($1, $2, $3, $4)
         returning {CONVERSATION_COLUMNS}"
    )))
    .bind(Uuid::new_v4())
    .bind(user_id)
    .bind(&project_id)
    .bind(title)
    .fetch_one(pool)
    .await?;
    Ok(conversation_view(row))
}

/// Appends `messages` to the conversation `target` names, in one transaction: the message rows,
/// and a task per user or assistant message (their memories' order is the messages'). With
/// `batch`, the tasks also form one batch whose id is answered (MemoryX's flush).
pub async fn append(
    state: &crate::core::state::AppState,
    user_id: i64,
    target: &Target,
    messages: &[NewMessage],
    batch: bool,
) -> AppResult<Appended> {
    // Each user or assistant message becomes a memory: the plan's memories quota must allow
    // them all (402 otherwise, nothing written).
    let remembered = messages
        .iter()
        .filter(|m| REMEMBERED.contains(&m.role.as_str()))
        .count();
    memories::charged(
        state,
        user_id,
        remembered,
        append_in(&state.pool, user_id, target, messages, batch),
    )
    .await
}

async fn append_in(
    pool: &PgPool,
    user_id: i64,
    target: &Target,
    messages: &[NewMessage],
    batch: bool,
) -> AppResult<Appended> {
    let mut tx = pool.begin().await?;
    let (conversation_id, project_id, count) = lock(&mut tx, user_id, target).await?;
    let message_ids: Vec<Uuid> = messages.iter().map(|_| Uuid::new_v4()).collect();
    let remembered: Vec<(usize, NewMemory)> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| REMEMBERED.contains(&m.role.as_str()))
        .map(|(i, m)| {
            let mut metadata = json!({
                "conversation_id": conversation_id.to_string(),
                "message_id": message_ids[i].to_string(),
                "role": m.role,
            });
            if let Some(t) = m.timestamp {
                metadata["timestamp"] = json!(iso(t));
            }
            if let Some(name) = &m.name {
                metadata["name"] = json!(name);
            }
            let memory = NewMemory {
                content: m.content.clone(),
                project: project_id.clone(),
                metadata: Some(metadata),
                agent_id: None,
            };
            (i, memory)
        })
        .collect();
    let positions: Vec<usize> = remembered.iter().map(|(i, _)| *i).collect();
    let memories: Vec<NewMemory> = remembered.into_iter().map(|(_, m)| m).collect();
    let (tasks, batch_id) = if memories.is_empty() && !batch {
        (vec![], None)
    } else {
        memories::enqueue_in(&mut tx, user_id, &project_id, memories, batch).await?
    };
    let mut task_ids = vec![None; messages.len()];
    for (i, t) in positions.into_iter().zip(tasks) {
        task_ids[i] = Some(t);
    }
    let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
    let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    let names: Vec<Option<&str>> = messages.iter().map(|m| m.name.as_deref()).collect();
    let tokens: Vec<Option<i32>> = messages.iter().map(|m| m.tokens).collect();
    let sent: Vec<Option<DateTime<Utc>>> = messages.iter().map(|m| m.timestamp).collect();
    let positions: Vec<i32> = (1..=messages.len() as i32).map(|p| p + count).collect();
    sqlx::query(
        "insert into conversation_messages (id, conversation_id, position, role, content, name, tokens, sent_at, task_id)
         select id, $2, position, role, content, name, tokens, sent_at, task_id
         from unnest($1::uuid[], $3::int[], $4::text[], $5::text[], $6::text[], $7::int[], $8::timestamptz[], $9::uuid[])
              as m(id, position, role, content, name, tokens, sent_at, task_id)",
    )
    .bind(&message_ids)
    .bind(conversation_id)
    .bind(&positions)
    .bind(&roles)
    .bind(&contents)
    .bind(&names)
    .bind(&tokens)
    .bind(&sent)
    .bind(&task_ids)
    .execute(&mut *tx)
    .await?;
    let title: Option<String> = messages
        .iter()
        .find(|m| m.role == "user")
        .map(|m| title_from(&m.content));
    sqlx::query(
        "update conversations set message_count = message_count + $2, updated_at = now(),
                title = coalesce(title, $3)
         where id = $1",
    )
    .bind(conversation_id)
    .bind(messages.len() as i32)
    .bind(title)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Appended {
        conversation_id,
        message_ids,
        task_ids,
        batch_id,
    })
}

/// A title from a message: its first line, at most [`TITLE_FROM_MESSAGE`] characters.
fn title_from(content: &str) -> String {
    let line = content.lines().next().unwrap_or_default().trim();
    if line.chars().count() <= TITLE_FROM_MESSAGE {
        line.to_string()
    } else {
        let cut: String = line.chars().take(TITLE_FROM_MESSAGE - 1).collect();
        format!("{}…", cut.trim_end())
    }
}

/// The conversation `target` names, created if it may be, locked for the append: its id,
/// project and message count.
async fn lock(
    tx: &mut PgConnection,
    user_id: i64,
    target: &Target,
) -> AppResult<(Uuid, String, i32)> {
    let project_missing = |e: sqlx::Error| match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23503") => {
            AppError::not_found("Project")
        }
        _ => e.into(),
    };
    let row: Option<(Uuid, String, i32)> = match target {
        Target::Id(id) => {
            sqlx::query_as("select id, project_id, message_count from conversations where id = $1 and user_id = $2 for update")
                .bind(id)
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?
        }
        Target::External { id, project } => {
            sqlx::query("insert into conversations (id, user_id, project_id, external_id) values ($1, $2, $3, $4) on conflict (user_id, external_id) do nothing")
                .bind(Uuid::new_v4())
                .bind(user_id)
                .bind(project)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(project_missing)?;
            sqlx::query_as("select id, project_id, message_count from conversations where user_id = $1 and external_id = $2 for update")
                .bind(user_id)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?
        }
        Target::New { id, project } => {
            sqlx::query("insert into conversations (id, user_id, project_id) values ($1, $2, $3) on conflict (id) do nothing")
                .bind(id)
                .bind(user_id)
                .bind(project)
                .execute(&mut *tx)
                .await
                .map_err(project_missing)?;
            sqlx::query_as("select id, project_id, message_count from conversations where id = $1 and user_id = $2 for update")
                .bind(id)
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?
        }
    };
    row.ok_or_else(|| AppError::not_found("Conversation"))
}

/// The id of the account's conversation `id` (a UUID, or its client id), if any.
pub async fn find(pool: &PgPool, user_id: i64, id: &str) -> AppResult<Option<Uuid>> {
    let uuid = Uuid::parse_str(id).ok();
    Ok(sqlx::query_scalar(
        "select id from conversations where user_id = $1 and (id = $2 or external_id = $3)
         order by (id = $2) desc nulls last limit 1",
    )
    .bind(user_id)
    .bind(uuid)
    .bind(id)
    .fetch_optional(pool)
    .await?)
}

const CONVERSATION_COLUMNS: &str =
    "id, project_id, title, external_id, message_count, created_at, updated_at";

type ConversationRow = (
    Uuid,
    String,
    Option<String>,
    Option<String>,
    i32,
    DateTime<Utc>,
    DateTime<Utc>,
);

fn conversation_view(
    (id, project_id, title, external_id, message_count, created_at, updated_at): ConversationRow,
) -> ConversationView {
    ConversationView {
        id: id.to_string(),
        project_id,
        title,
        external_id,
        message_count: message_count.into(),
        created_at: iso(created_at),
        updated_at: iso(updated_at),
    }
}

fn parse_id(id: &str) -> AppResult<Uuid> {
    Uuid::parse_str(id).map_err(|_| AppError::not_found("Conversation"))
}

/// The account's conversations, most recently active first, and how many there are.
pub async fn list(
    pool: &PgPool,
    user_id: i64,
    limit: i64,
    offset: i64,
) -> AppResult<(Vec<ConversationView>, i64)> {
    let rows: Vec<ConversationRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {CONVERSATION_COLUMNS} from conversations where user_id = $1
         order by updated_at desc, id desc limit $2 offset $3"
    )))
    .bind(user_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    let total: i64 = sqlx::query_scalar("select count(*) from conversations where user_id = $1")
        .bind(user_id)
        .fetch_one(pool)
        .await?;
    Ok((rows.into_iter().map(conversation_view).collect(), total))
}

/// One of the account's conversations.
pub async fn get(pool: &PgPool, user_id: i64, id: &str) -> AppResult<ConversationView> {
    let row: Option<ConversationRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {CONVERSATION_COLUMNS} from conversations where id = $1 and user_id = $2"
    )))
    .bind(parse_id(id)?)
    .bind(user_id)
    .fetch_optional(pool)
    .await?;
    row.map(conversation_view)
        .ok_or_else(|| AppError::not_found("Conversation"))
}

type MessageRow = (
    Uuid,
    i32,
    String,
    String,
    Option<String>,
    Option<i32>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
    Option<Uuid>,
    Option<String>,
    Option<Uuid>,
    Option<String>,
    Option<f32>,
);

/// A page of a conversation's messages in order (the caller has checked the conversation is
/// the account's), each with its task and memory.
pub async fn messages(
    pool: &PgPool,
    user_id: i64,
    conversation_id: &str,
    limit: i64,
    offset: i64,
) -> AppResult<Vec<MessageView>> {
    let rows: Vec<MessageRow> = sqlx::query_as(
        "select m.id, m.position, m.role, m.content, m.name, m.tokens, m.sent_at, m.created_at,
                m.task_id, t.status, t.memory_id, t.cognitive_sector, t.importance_score
         from conversation_messages m
         join conversations c on c.id = m.conversation_id and c.user_id = $2
         left join tasks t on t.id = m.task_id and t.user_id = $2
         where m.conversation_id = $1
         order by m.position limit $3 offset $4",
    )
    .bind(parse_id(conversation_id)?)
    .bind(user_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(
                id,
                position,
                role,
                content,
                name,
                tokens,
                sent_at,
                created_at,
                task_id,
                status,
                memory_id,
                sector,
                importance,
            )| MessageView {
                id: id.to_string(),
                position,
                role,
                content,
                name,
                tokens,
                timestamp: iso_opt(sent_at),
                created_at: iso(created_at),
                task_id: task_id.map(|t| t.to_string()),
                task_status: status,
                memory_id: memory_id.map(|m| m.to_string()),
                cognitive_sector: sector,
                importance_score: importance,
            },
        )
        .collect())
}

/// Deletes one of the account's conversations and its messages; with `memories`, also the
/// memories (and tasks) its messages produced, else those stay.
pub async fn delete(pool: &PgPool, user_id: i64, id: &str, memories: bool) -> AppResult<()> {
    let id = parse_id(id)?;
    let mut tx = pool.begin().await?;
    if memories {
        // Through the message rows' task ids: the memories' unique index on `task_id`. A task
        // still pending goes too, so no memory appears afterwards.
        sqlx::query(
            "with t as (select task_id from conversation_messages m
                        join conversations c on c.id = m.conversation_id
                        where m.conversation_id = $1 and c.user_id = $2 and m.task_id is not null),
             gone as (delete from memories where user_id = $2 and task_id in (select task_id from t))
             delete from tasks where user_id = $2 and id in (select task_id from t)",
        )
        .bind(id)
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
    }
    let deleted = sqlx::query("delete from conversations where id = $1 and user_id = $2")
        .bind(id)
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if deleted == 0 {
        return Err(AppError::not_found("Conversation"));
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_the_first_line_cut_short() {
        assert_eq!(title_from("Plan the trip\nto Lisbon"), "Plan the trip");
        let long = "word ".repeat(40);
        let t = title_from(&long);
        assert_eq!(t.chars().count(), TITLE_FROM_MESSAGE);
        assert!(t.ends_with('…'));
    }

    #[test]
    fn messages_are_read_with_every_rule() {
        let mut f = Fields::from_value(json!({"messages": [
            {"role": "user", "content": "hi", "timestamp": 1_732_442_400_000_i64, "tokens": 3},
            {"role": "robot", "content": ""},
            {"role": "assistant", "content": "hello", "timestamp": "2026-11-24T10:00:00Z"}
        ]}))
        .unwrap();
        let read = read_messages(&mut f);
        assert_eq!(read.len(), 2);
        assert_eq!(
            read[0].timestamp.unwrap().timestamp_millis(),
            1_732_442_400_000
        );
        assert_eq!(read[0].tokens, Some(3));
        let Err(AppError::Validation(errors)) = f.finish() else {
            panic!("the bad message must be refused")
        };
        let locs: Vec<String> = errors
            .iter()
            .map(|e| serde_json::to_string(&e.loc).unwrap())
            .collect();
        assert_eq!(
            locs,
            [
                r#"["body","messages",1,"role"]"#,
                r#"["body","messages",1,"content"]"#
            ]
        );
    }
}
