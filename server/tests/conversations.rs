//! Conversations: every endpoint's success and error cases, messages remembered as memories
//! (system and tool messages stored only), isolation between accounts, MemoryX's flush alias.
mod common;

use common::*;
use serde_json::{json, Value};

async fn create(app: &TestApp, key: &str, body: Value) -> Value {
    let (s, b) = app
        .post_json("/api/v1/conversations", &body, Some(key))
        .await;
    assert_eq!(s, 200, "{b}");
    b["data"].clone()
}

async fn append(
    app: &TestApp,
    key: &str,
    id: &str,
    messages: Value,
) -> (reqwest::StatusCode, Value) {
    app.post_json(
        &format!("/api/v1/conversations/{id}/messages"),
        &json!({"messages": messages}),
        Some(key),
    )
    .await
}

#[tokio::test]
async fn messages_are_stored_in_order_and_user_and_assistant_ones_remembered() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("chatty@example.com").await;
    let conv = create(&app, &key, json!({"title": "Trip planning"})).await;
    let id = conv["id"].as_str().unwrap().to_string();
    assert_eq!(conv["project_id"], "default");
    assert_eq!(conv["message_count"], 0);

    let (s, b) = append(
        &app,
        &key,
        &id,
        json!([
            {"role": "system", "content": "You are a travel assistant."},
            {"role": "user", "content": "My daughter Mia is severely allergic to peanuts.", "timestamp": "2026-11-20T09:00:00Z"},
            {"role": "assistant", "content": "Noted: no peanuts for Mia on the trip."},
            {"role": "tool", "content": "{\"restaurants\": 3}", "name": "search_restaurants"}
        ]),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["conversation_id"], id.as_str());
    let tasks = b["task_ids"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    assert!(
        tasks[0].is_null() && tasks[3].is_null(),
        "system and tool messages are not remembered: {b}"
    );
    let user_task = tasks[1].as_str().unwrap();
    let assistant_task = tasks[2].as_str().unwrap();
    let done = app.wait_task(&key, user_task).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        app.wait_task(&key, assistant_task).await["status"],
        "completed"
    );

    // The memory names its conversation, message and role, and takes the message's date.
    let memory_id = done["memory_id"].as_str().unwrap();
    let (s, m) = app
        .get(&format!("/api/v1/memories/{memory_id}"), Some(&key))
        .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(
        m["data"]["content"],
        "My daughter Mia is severely allergic to peanuts."
    );
    assert_eq!(m["data"]["metadata"]["conversation_id"], id.as_str());
    assert_eq!(m["data"]["metadata"]["role"], "user");
    assert_eq!(m["data"]["metadata"]["message_id"], b["message_ids"][1]);
    assert_eq!(
        m["data"]["metadata"]["timestamp"],
        "2026-11-20T09:00:00.000Z"
    );

    // A second append continues the order.
    let (s, more) = append(
        &app,
        &key,
        &id,
        json!([{"role": "user", "content": "Also, we land on Friday."}]),
    )
    .await;
    assert_eq!(s, 200, "{more}");

    let (s, got) = app
        .get(&format!("/api/v1/conversations/{id}"), Some(&key))
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["data"]["message_count"], 5);
    assert_eq!(got["data"]["title"], "Trip planning");
    let msgs = got["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    let positions: Vec<i64> = msgs
        .iter()
        .map(|m| m["position"].as_i64().unwrap())
        .collect();
    assert_eq!(positions, [1, 2, 3, 4, 5]);
    assert_eq!(msgs[3]["name"], "search_restaurants");
    assert_eq!(msgs[1]["memory_id"], memory_id);
    assert_eq!(msgs[1]["task_status"], "completed");
    assert!(msgs[0]["task_id"].is_null());

    // Paged.
    let (_, page) = app
        .get(
            &format!("/api/v1/conversations/{id}?limit=2&offset=3"),
            Some(&key),
        )
        .await;
    let positions: Vec<i64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["position"].as_i64().unwrap())
        .collect();
    assert_eq!(positions, [4, 5]);

    // A conversation's memories are one stream, apart from other memories of the project.
    app.store_all(
        &key,
        vec![json!({"content": "An unrelated note between the turns"})],
    )
    .await;
    let streams: Vec<String> =
        sqlx::query_scalar("select distinct stream from memories order by 1")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(streams, ["".to_string(), format!(" #{id}")]);
}

#[tokio::test]
async fn lists_are_newest_first_with_counts_and_untitled_ones_take_the_first_user_message() {
    let app = spawn_app().await;
    let (_, key) = app.user("lister@example.com").await;
    let first = create(&app, &key, json!({})).await;
    let second = create(&app, &key, json!({"title": "Second"})).await;
    let (s, _) = append(&app, &key, first["id"].as_str().unwrap(), json!([{"role": "user", "content": "What did the plumber say about the boiler?\nMore text"}])).await;
    assert_eq!(s, 200);
    let (s, list) = app.get("/api/v1/conversations", Some(&key)).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["total"], 2);
    let data = list["data"].as_array().unwrap();
    // The one just appended to is the most recently active.
    assert_eq!(data[0]["id"], first["id"]);
    assert_eq!(
        data[0]["title"],
        "What did the plumber say about the boiler?"
    );
    assert_eq!(data[0]["message_count"], 1);
    assert_eq!(data[1]["id"], second["id"]);
    let (_, paged) = app
        .get("/api/v1/conversations?limit=1&offset=1", Some(&key))
        .await;
    assert_eq!(paged["data"].as_array().unwrap().len(), 1);
    assert_eq!(paged["data"][0]["id"], second["id"]);

    // A conversation in another project.
    let (s, p) = app
        .post_json("/api/v1/projects", &json!({"name": "work"}), Some(&key))
        .await;
    assert_eq!(s, 200, "{p}");
    let in_work = create(&app, &key, json!({"project_id": "work"})).await;
    assert_eq!(in_work["project_id"], p["data"]["id"]);
    let (s, b) = app
        .post_json(
            "/api/v1/conversations",
            &json!({"project_id": "nope"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 404, "{b}");
}

#[tokio::test]
async fn bad_messages_are_422_and_nothing_is_written() {
    let app = spawn_app().await;
    let (_, key) = app.user("strict@example.com").await;
    let conv = create(&app, &key, json!({})).await;
    let id = conv["id"].as_str().unwrap();

    let (s, b) = append(
        &app,
        &key,
        id,
        json!([{"role": "user", "content": "fine"}, {"role": "robot", "content": "beep"}]),
    )
    .await;
    assert_validation(s, &b, &["body", "messages", "1", "role"]);
    let (s, b) = append(&app, &key, id, json!([{"role": "user", "content": "   "}])).await;
    assert_validation(s, &b, &["body", "messages", "0", "content"]);
    let (s, b) = append(&app, &key, id, json!([{"role": "user"}])).await;
    assert_validation(s, &b, &["body", "messages", "0", "content"]);
    let (s, b) = append(
        &app,
        &key,
        id,
        json!([{"role": "user", "content": "x".repeat(32_769)}]),
    )
    .await;
    assert_validation(s, &b, &["body", "messages", "0", "content"]);
    let (s, b) = append(
        &app,
        &key,
        id,
        json!([{"role": "user", "content": "x", "timestamp": "yesterday"}]),
    )
    .await;
    assert_validation(s, &b, &["body", "messages", "0", "timestamp"]);
    let many: Vec<Value> = (0..101)
        .map(|i| json!({"role": "user", "content": format!("m{i}")}))
        .collect();
    let (s, b) = append(&app, &key, id, json!(many)).await;
    assert_validation(s, &b, &["body", "messages"]);
    let (s, b) = append(&app, &key, id, json!([])).await;
    assert_validation(s, &b, &["body", "messages"]);
    let (s, b) = app
        .post_json(
            &format!("/api/v1/conversations/{id}/messages"),
            &json!({}),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["body", "messages"]);

    let count: i64 = sqlx::query_scalar("select count(*) from conversation_messages")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
    let tasks: i64 = sqlx::query_scalar("select count(*) from tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 0);
    // Exactly 100 is allowed.
    let hundred: Vec<Value> = (0..100)
        .map(|i| json!({"role": "assistant", "content": format!("m{i}")}))
        .collect();
    let (s, b) = append(&app, &key, id, json!(hundred)).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["task_ids"].as_array().unwrap().len(), 100);
}

#[tokio::test]
async fn another_accounts_conversations_are_invisible() {
    let app = spawn_app().await;
    let (_, owner) = app.user("owner@example.com").await;
    let (_, other) = app.user("other@example.com").await;
    let conv = create(&app, &owner, json!({"title": "private"})).await;
    let id = conv["id"].as_str().unwrap();
    let (s, _) = append(
        &app,
        &owner,
        id,
        json!([{"role": "user", "content": "secret plan"}]),
    )
    .await;
    assert_eq!(s, 200);

    let (s, b) = app
        .get(&format!("/api/v1/conversations/{id}"), Some(&other))
        .await;
    assert_eq!(s, 404, "{b}");
    assert_eq!(b["success"], false);
    let (s, _) = append(
        &app,
        &other,
        id,
        json!([{"role": "user", "content": "intrusion"}]),
    )
    .await;
    assert_eq!(s, 404);
    let (s, _) = app
        .delete(&format!("/api/v1/conversations/{id}"), Some(&other))
        .await;
    assert_eq!(s, 404);
    let (_, list) = app.get("/api/v1/conversations", Some(&other)).await;
    assert_eq!(list["total"], 0);
    // Not a UUID, or no such conversation: 404 likewise.
    for bad in ["not-a-uuid", "00000000-0000-0000-0000-000000000000"] {
        let (s, _) = app
            .get(&format!("/api/v1/conversations/{bad}"), Some(&owner))
            .await;
        assert_eq!(s, 404);
    }
    // Unauthenticated.
    let (s, _) = app.get("/api/v1/conversations", None).await;
    assert_eq!(s, 401);
    // Still intact for its owner.
    let (_, got) = app
        .get(&format!("/api/v1/conversations/{id}"), Some(&owner))
        .await;
    assert_eq!(got["data"]["message_count"], 1);
}

#[tokio::test]
async fn deleting_keeps_the_memories_unless_asked_to_delete_them() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("deleter@example.com").await;
    let keep = create(&app, &key, json!({})).await;
    let drop = create(&app, &key, json!({})).await;
    let mut memory_of = vec![];
    for conv in [&keep, &drop] {
        let (s, b) = append(
            &app,
            &key,
            conv["id"].as_str().unwrap(),
            json!([{"role": "user", "content": format!("Memory of {}", conv["id"])}]),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let task = app
            .wait_task(&key, b["task_ids"][0].as_str().unwrap())
            .await;
        memory_of.push(task["memory_id"].as_str().unwrap().to_string());
    }
    let (s, b) = app
        .delete(
            &format!("/api/v1/conversations/{}", keep["id"].as_str().unwrap()),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .delete(
            &format!(
                "/api/v1/conversations/{}?memories=delete",
                drop["id"].as_str().unwrap()
            ),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, _) = app
        .get(&format!("/api/v1/memories/{}", memory_of[0]), Some(&key))
        .await;
    assert_eq!(s, 200, "kept");
    let (s, _) = app
        .get(&format!("/api/v1/memories/{}", memory_of[1]), Some(&key))
        .await;
    assert_eq!(s, 404, "deleted with its conversation");
    let (_, list) = app.get("/api/v1/conversations", Some(&key)).await;
    assert_eq!(list["total"], 0);
    let messages: i64 = sqlx::query_scalar("select count(*) from conversation_messages")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(messages, 0);
    let (s, b) = app
        .delete(
            &format!(
                "/api/v1/conversations/{}?memories=maybe",
                keep["id"].as_str().unwrap()
            ),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["query", "memories"]);
}

#[tokio::test]
async fn memoryx_flush_appends_to_the_clients_conversation_and_answers_one_task() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("flusher@example.com").await;
    let flush = |messages: Value, conversation: Value| json!({"conversation_id": conversation, "messages": messages});
    let (s, first) = app
        .post_json(
            "/api/v1/conversations/flush",
            &flush(
                json!([
                    {"role": "user", "content": "Book the usual table for Friday", "timestamp": 1_764_000_000_000_i64, "tokens": 7},
                    {"role": "assistant", "content": "Done: Friday 8 pm", "timestamp": 1_764_000_004_000_i64, "tokens": 5}
                ]),
                json!("chat-42"),
            ),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["status"], "queued");
    assert_eq!(first["message_count"], 2);
    let task = app
        .wait_task(&key, first["task_id"].as_str().unwrap())
        .await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["batch"]["memory_ids"].as_array().unwrap().len(), 2);

    // The same client id appends to the same conversation.
    let (s, second) = app
        .post_json(
            "/api/v1/conversations/flush",
            &flush(
                json!([{"role": "user", "content": "Make it 9 pm instead"}]),
                json!("chat-42"),
            ),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{second}");
    assert_eq!(second["conversation_id"], first["conversation_id"]);
    let (_, got) = app
        .get(
            &format!(
                "/api/v1/conversations/{}",
                first["conversation_id"].as_str().unwrap()
            ),
            Some(&key),
        )
        .await;
    assert_eq!(got["data"]["external_id"], "chat-42");
    assert_eq!(got["data"]["message_count"], 3);
    assert_eq!(got["messages"][0]["tokens"], 7);
    assert_eq!(got["messages"][0]["timestamp"], "2025-11-24T16:00:00.000Z");

    // No id: a new conversation each time. Another account's same client id is its own.
    let (_, fresh) = app
        .post_json(
            "/api/v1/conversations/flush",
            &flush(json!([{"role": "user", "content": "hello"}]), Value::Null),
            Some(&key),
        )
        .await;
    assert_ne!(fresh["conversation_id"], first["conversation_id"]);
    let (_, other) = app.user("flusher2@example.com").await;
    let (s, theirs) = app
        .post_json(
            "/api/v1/conversations/flush",
            &flush(
                json!([{"role": "user", "content": "mine"}]),
                json!("chat-42"),
            ),
            Some(&other),
        )
        .await;
    assert_eq!(s, 200, "{theirs}");
    assert_ne!(theirs["conversation_id"], first["conversation_id"]);
    let (_, got) = app
        .get(
            &format!(
                "/api/v1/conversations/{}",
                first["conversation_id"].as_str().unwrap()
            ),
            Some(&key),
        )
        .await;
    assert_eq!(
        got["data"]["message_count"], 3,
        "the other account's flush did not land here"
    );

    let (s, b) = app
        .post_json(
            "/api/v1/conversations/flush",
            &flush(json!([{"role": "narrator", "content": "x"}]), json!("c")),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["body", "messages", "0", "role"]);
}
