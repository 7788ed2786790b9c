//! Hybrid search: shapes, ranking (keyword-only and paraphrase-only matches), project filters,
//! and tenant filtering that never drops results.
mod common;

use common::*;
use serde_json::{json, Value};

async fn search(app: &TestApp, key: &str, body: Value) -> Vec<Value> {
    let (s, b) = app
        .post_json("/api/v1/memories/search", &body, Some(key))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["success"], true);
    assert_eq!(b["query"], body["query"]);
    b["data"].as_array().unwrap().clone()
}

fn contents(hits: &[Value]) -> Vec<String> {
    hits.iter()
        .map(|h| h["content"].as_str().unwrap().to_string())
        .collect()
}

const CORPUS: [&str; 10] = [
    "The quarterly budget review is scheduled for the second week of March.",
    "My sister adopted a golden retriever puppy named Biscuit.",
    "To reset the router, hold the power button for ten seconds.",
    "I felt anxious before giving the keynote at the conference.",
    "Looking back, moving to a smaller team made me happier.",
    "Replacement part serial XJ-4471 was ordered for the compressor.",
    "We hiked to the glacier lake and camped under the stars.",
    "Python's GIL prevents threads from running bytecode in parallel.",
    "The dentist appointment moved to Thursday afternoon.",
    "Our office coffee machine only takes oat milk now.",
];

#[tokio::test]
async fn keyword_only_and_paraphrase_only_matches_are_both_found() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("finder@example.com").await;
    app.store_all(&key, CORPUS.iter().map(|c| json!({"content": c})).collect())
        .await;

    // A rare token the embedding barely sees.
    let hits = search(&app, &key, json!({"query": "XJ-4471", "limit": 3})).await;
    assert_eq!(contents(&hits)[0], CORPUS[5], "{hits:?}");
    // No word in common with the memory.
    let hits = search(
        &app,
        &key,
        json!({"query": "what kind of dog does my sibling have", "limit": 3}),
    )
    .await;
    assert_eq!(contents(&hits)[0], CORPUS[1], "{hits:?}");
    let hits = search(
        &app,
        &key,
        json!({"query": "nervous about public speaking", "limit": 3}),
    )
    .await;
    assert_eq!(contents(&hits)[0], CORPUS[3], "{hits:?}");

    // Shape and order.
    let hits = search(&app, &key, json!({"query": "router reset steps"})).await;
    assert_eq!(hits.len(), 10);
    let scores: Vec<f64> = hits.iter().map(|h| h["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    assert!(scores.iter().all(|s| (0.0..=1.0).contains(s)));
    for field in [
        "id",
        "content",
        "score",
        "cognitive_sector",
        "importance_score",
        "project_id",
        "metadata",
        "created_at",
    ] {
        assert!(hits[0].as_object().unwrap().contains_key(field), "{field}");
    }
}

#[tokio::test]
async fn search_filters_by_project_and_validates_its_input() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("filter@example.com").await;
    app.post_json("/api/v1/projects", &json!({"name": "garden"}), Some(&key))
        .await;
    app.store_all(
        &key,
        vec![
            json!({"content": "Tomatoes need staking in June", "project_id": "garden"}),
            json!({"content": "Tomatoes were on sale at the market"}),
        ],
    )
    .await;
    let hits = search(
        &app,
        &key,
        json!({"query": "tomatoes", "project_id": "garden"}),
    )
    .await;
    assert_eq!(contents(&hits), vec!["Tomatoes need staking in June"]);
    assert_eq!(
        search(&app, &key, json!({"query": "tomatoes"})).await.len(),
        2
    );
    assert_eq!(
        search(&app, &key, json!({"query": "tomatoes", "limit": 1}))
            .await
            .len(),
        1
    );

    for (body, field) in [
        (json!({}), "query"),
        (json!({"query": ""}), "query"),
        (json!({"query": "x".repeat(4097)}), "query"),
        (json!({"query": "x", "limit": 0}), "limit"),
        (json!({"query": "x", "limit": 101}), "limit"),
        (json!({"query": "x", "limit": "ten"}), "limit"),
    ] {
        let (s, b) = app
            .post_json("/api/v1/memories/search", &body, Some(&key))
            .await;
        assert_validation(s, &b, &["body", field]);
    }
    let (s, _) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "x", "project_id": "nope"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 404);
    assert_eq!(
        app.post_json("/api/v1/memories/search", &json!({"query": "x"}), None)
            .await
            .0,
        401
    );
}

/// An account and its default project, written straight into the tables; its id.
async fn bare_account(app: &TestApp, email: &str) -> i64 {
    let user: i64 = sqlx::query_scalar("insert into users (email) values ($1) returning id")
        .bind(email)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    sqlx::query("insert into projects (user_id, id, name) values ($1, 'default', 'default')")
        .bind(user)
        .execute(&app.pool)
        .await
        .unwrap();
    user
}

/// Random unit vectors for other accounts' memories, written straight into the table (the
/// pipeline would take an hour for 100,000); our own account's memories go through the pipeline.
async fn crowd(app: &TestApp, accounts: i64, per_account: i64) {
    sqlx::query("drop index memories_embedding_idx")
        .execute(&app.pool)
        .await
        .unwrap();
    for a in 0..accounts {
        let user = bare_account(app, &format!("crowd{a}@example.com")).await;
        sqlx::query(
            "insert into memories (id, user_id, project_id, content, cognitive_sector, importance_score, embedding, embedding_model)
             select gen_random_uuid(), $1, 'default', 'crowd memory about dogs and budgets ' || g, 'semantic', 0.5,
                    (select array_agg(random() - 0.5) from generate_series(1, 384) where g > 0)::vector, 'random'
             from generate_series(1, $2) g",
        )
        .bind(user)
        .bind(per_account)
        .execute(&app.pool)
        .await
        .unwrap();
    }
    // One connection, so the memory setting applies to the build; a light graph (m = 8): this
    // test is about filtering, not about the index's recall.
    let mut conn = app.pool.acquire().await.unwrap();
    sqlx::query("set maintenance_work_mem = '256MB'")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("create index memories_embedding_idx on memories using hnsw (embedding vector_cosine_ops) with (m = 8, ef_construction = 24)").execute(&mut *conn).await.unwrap();
    sqlx::query("analyze memories")
        .execute(&app.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_small_account_among_100000_memories_gets_all_its_results() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("small@example.com").await;
    let own: Vec<Value> = (0..20)
        .map(|i| json!({"content": format!("note {i}: my dog prefers the budget kibble brand")}))
        .collect();
    let own_ids = app.store_all(&key, own).await;
    crowd(&app, 4, 25_000).await;

    for (limit, expected) in [(10, 10), (50, 20), (100, 20)] {
        let hits = search(
            &app,
            &key,
            json!({"query": "dogs and budgets", "limit": limit}),
        )
        .await;
        assert_eq!(hits.len(), expected, "limit {limit}");
        assert!(
            hits.iter()
                .all(|h| own_ids.contains(&h["id"].as_str().unwrap().to_string())),
            "another account's memory leaked"
        );
    }
    // A crowd account (25,000 memories: the HNSW path) also gets full pages of its own.
    let (crowd_user,): (i64,) =
        sqlx::query_as("select id from users where email = 'crowd0@example.com'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let key = app::core::keys::create(&app.pool, crowd_user, None, "crowd")
        .await
        .unwrap()
        .key;
    let hits = search(
        &app,
        &key,
        json!({"query": "dogs and budgets", "limit": 100}),
    )
    .await;
    assert_eq!(hits.len(), 100);
    let ids: Vec<uuid::Uuid> = hits
        .iter()
        .map(|h| h["id"].as_str().unwrap().parse().unwrap())
        .collect();
    let theirs: i64 =
        sqlx::query_scalar("select count(*) from memories where id = any($1) and user_id = $2")
            .bind(&ids)
            .bind(crowd_user)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(theirs, 100);
}

const CONVERSATION: [&str; 12] = [
    "Alice: I watched a documentary about impressionist artists.",
    "Alice: The art supply shop closes early on Sundays.",
    "Alice: Morning Bob, how was your week?",
    "Bob: Busy, the quarterly report took most of it.",
    "Alice: Did you finish reading that mystery novel?",
    "Bob: Yes, the detective was the culprit all along.",
    "Alice: What did you paint last weekend, Bob?",
    "Bob: A sunset over the harbour, in watercolour.",
    "Alice: Are you still going to the climbing gym?",
    "Bob: Twice a week, my fingers are getting stronger.",
    "Alice: My cousin is visiting from Lisbon next month.",
    "Bob: Lovely, take her to the botanical gardens.",
];

/// The rank (0-based) and score of `content` among the hits.
fn place(hits: &[Value], content: &str) -> (usize, f64) {
    let i = hits
        .iter()
        .position(|h| h["content"] == content)
        .unwrap_or_else(|| panic!("{content:?} not found in {hits:?}"));
    (i, hits[i]["score"].as_f64().unwrap())
}

#[tokio::test]
async fn an_answer_is_found_through_the_question_before_it() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("talk@example.com").await;
    for name in ["talk", "apart"] {
        app.post_json("/api/v1/projects", &json!({"name": name}), Some(&key))
            .await;
    }
    // The same turns twice: once as one conversation (one stream, in order), once with every
    // turn from a different agent, so that no turn is another's neighbour.
    let mut payloads: Vec<Value> = CONVERSATION
        .iter()
        .map(|c| json!({"content": c, "project_id": "talk"}))
        .collect();
    payloads.extend(CONVERSATION.iter().enumerate().map(
        |(i, c)| json!({"content": c, "project_id": "apart", "agent_id": format!("agent-{i}")}),
    ));
    app.store_all(&key, payloads).await;

    // The order of submission is kept: the answer directly follows its question.
    let seqs: Vec<String> = sqlx::query_scalar(
        "select content from memories where project_id = (select id from projects where name = 'talk')
         order by seq",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(seqs, CONVERSATION);

    let answer = CONVERSATION[7];
    let query = "What was painted last weekend?";
    let talk = search(&app, &key, json!({"query": query, "project_id": "talk"})).await;
    let apart = search(&app, &key, json!({"query": query, "project_id": "apart"})).await;
    let (talk_rank, talk_score) = place(&talk, answer);
    let (apart_rank, apart_score) = place(&apart, answer);
    // Its question comes first; the question's other neighbour can come between them.
    assert!(
        talk_rank <= 2,
        "{:?}\n{:?}",
        contents(&talk),
        contents(&apart)
    );
    assert!(
        talk_rank < apart_rank && talk_score > apart_score + 0.05,
        "in the conversation: #{talk_rank} {talk_score:.3}; apart: #{apart_rank} {apart_score:.3}\n{:?}\n{:?}",
        contents(&talk),
        contents(&apart)
    );
}

#[tokio::test]
async fn a_query_naming_a_day_favours_memories_of_that_day() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("diary@example.com").await;
    let content = "We visited the science museum with the kids.";
    let ids = app
        .store_all(
            &key,
            vec![
                json!({"content": content, "metadata": {"event_time": "2023-05-08T14:00:00Z"}}),
                json!({"content": content, "metadata": {"date": "20 June, 2023"}}),
                json!({"content": "The kids loved the planetarium show."}),
            ],
        )
        .await;
    let days: Vec<String> = sqlx::query_scalar(
        "select event_day::text from memories where id = any($1::uuid[]) order by seq",
    )
    .bind(&ids)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let today = chrono::Utc::now().date_naive().to_string();
    assert_eq!(
        days,
        vec!["2023-05-08".to_string(), "2023-06-20".into(), today]
    );

    // The two visits differ only in their days: the day the query names decides, either way.
    for (query, day) in [
        ("Where did we go on 20 June 2023?", ids[1].as_str()),
        ("Where did we go on 8 May 2023?", ids[0].as_str()),
        ("Where did we go in June 2023?", ids[1].as_str()),
    ] {
        let hits = search(&app, &key, json!({"query": query})).await;
        assert_eq!(hits[0]["id"], day, "{query}: {hits:?}");
    }
}

#[tokio::test]
async fn a_query_naming_a_speaker_favours_their_own_words() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("speakers@example.com").await;
    for name in ["labels", "metadata"] {
        app.post_json("/api/v1/projects", &json!({"name": name}), Some(&key))
            .await;
    }
    // Each speaker mentions the other: only the author tells them apart. The same twice: the
    // author as the content's label, and as the metadata's `speaker`.
    let by_alice = "Alice: Bob and I went hiking in the mountains last weekend.";
    let by_bob = "Bob: Alice and I went hiking in the mountains last weekend.";
    let plain = "We went hiking in the mountains last weekend.";
    let ids = app
        .store_all(
            &key,
            vec![
                json!({"content": by_alice, "project_id": "labels", "agent_id": "a"}),
                json!({"content": by_bob, "project_id": "labels", "agent_id": "b"}),
                json!({"content": plain, "project_id": "metadata", "agent_id": "a", "metadata": {"speaker": "Alice"}}),
                json!({"content": plain, "project_id": "metadata", "agent_id": "b", "metadata": {"speaker": "Bob Stone"}}),
            ],
        )
        .await;
    for (query, labels, metadata) in [
        ("Where did Alice go hiking?", by_alice, &ids[2]),
        ("where did bob go hiking", by_bob, &ids[3]),
    ] {
        let hits = search(&app, &key, json!({"query": query, "project_id": "labels"})).await;
        assert_eq!(contents(&hits)[0], labels, "{query}: {hits:?}");
        let hits = search(
            &app,
            &key,
            json!({"query": query, "project_id": "metadata"}),
        )
        .await;
        assert_eq!(hits[0]["id"], metadata.as_str(), "{query}: {hits:?}");
        assert!(
            hits[0]["score"].as_f64() > hits[1]["score"].as_f64(),
            "{query}: {hits:?}"
        );
    }
    // A query naming nobody: the same words score alike, whoever said them.
    let hits = search(
        &app,
        &key,
        json!({"query": "hiking in the mountains", "project_id": "metadata"}),
    )
    .await;
    assert_eq!(hits[0]["score"], hits[1]["score"], "{hits:?}");
}

/// Search's plans depend on the account's row estimate: once enough of `memories` changed since
/// its last ANALYZE, the housekeeping loop's check analyzes it again (autovacuum may be off, and
/// waits for 10 % of the table when on); below the threshold it does not.
#[tokio::test]
async fn memories_are_analyzed_again_once_enough_of_them_changed() {
    use app::core::memories::{analyze_if_changed, ANALYZE_AFTER_ROWS};
    let app = spawn_app().await;
    let user = bare_account(&app, "bulk@example.com").await;
    let add = |n: i64| {
        sqlx::query(
            "insert into memories (id, user_id, project_id, content, cognitive_sector, importance_score, embedding, embedding_model)
             select gen_random_uuid(), $1, 'default', 'bulk memory ' || g, 'semantic', 0.5,
                    array_fill(0.05, array[384])::vector, 'none'
             from generate_series(1, $2) g",
        )
        .bind(user)
        .bind(n)
        .execute(&app.pool)
    };
    // Rows changed since the last ANALYZE, as the statistics system reports them (a backend
    // reports its counts when it goes idle, at most 10 s later).
    let changed_at_least = |n: i64| {
        let pool = app.pool.clone();
        async move {
            for _ in 0..200 {
                let changed: i64 = sqlx::query_scalar(
                    "select n_mod_since_analyze from pg_stat_user_tables where relid = 'memories'::regclass",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                if changed >= n {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            panic!("the statistics never reported {n} changed rows");
        }
    };
    sqlx::query("analyze memories")
        .execute(&app.pool)
        .await
        .unwrap();

    add(10).await.unwrap();
    changed_at_least(10).await;
    assert!(
        !analyze_if_changed(&app.pool).await.unwrap(),
        "10 changed rows"
    );

    add(ANALYZE_AFTER_ROWS + 100).await.unwrap();
    changed_at_least(ANALYZE_AFTER_ROWS + 110).await;
    assert!(analyze_if_changed(&app.pool).await.unwrap());
    let (changed, analyzed): (i64, bool) = sqlx::query_as(
        "select n_mod_since_analyze, last_analyze is not null from pg_stat_user_tables where relid = 'memories'::regclass",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((changed, analyzed), (0, true));
    // The planner now knows the account's rows (before: none, as the table was empty then).
    let plan: Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "explain (format json) select id from memories where user_id = {user}"
    )))
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let rows = plan[0]["Plan"]["Plan Rows"].as_f64().unwrap();
    assert!(
        rows > 1_000.0,
        "estimated {rows} rows of {}",
        ANALYZE_AFTER_ROWS + 110
    );
    assert!(
        !analyze_if_changed(&app.pool).await.unwrap(),
        "just analyzed"
    );
}

/// Where the query's rarest term is in more memories than the keyword part reads (about 300),
/// it reads the newest of them: the memory written last is found by its words although 400
/// older ones share them and every vector candidate is another memory. Before, up to 600 were
/// read in storage order, whatever their age.
#[tokio::test]
async fn the_newest_memories_of_a_common_term_are_read_first() {
    let app = spawn_app().await;
    let user = bare_account(&app, "harbour@example.com").await;
    let key = app::core::keys::create(&app.pool, user, None, "harbour")
        .await
        .unwrap()
        .key;
    let query = "harbour";
    let q = app.state.embedder.embed_query(query).await.unwrap();
    // `a · q + noise` (384 uniform draws in ±0.5, norm about 5.7): cosine to the query about
    // a / √(a² + 32), so 5.5 gives ~0.70 and 4.2 ~0.60; 0 gives ~0. (`0 * g` ties the vector's
    // subquery to its row, so each memory draws its own noise instead of sharing one vector.)
    let add = |content: &'static str, count: i64, a: f32| {
        let (pool, q) = (app.pool.clone(), q.clone());
        async move {
            sqlx::query(
                "insert into memories (id, user_id, project_id, content, cognitive_sector, importance_score, embedding, embedding_model)
                 select gen_random_uuid(), $1, 'default', replace($2, '#', g::text), 'semantic', 0.5,
                        (select array_agg($4 * q + random() - 0.5 + 0 * g) from unnest($5::float4[]) q)::vector, 'test'
                 from generate_series(1, $3) g",
            )
            .bind(user)
            .bind(content)
            .bind(count)
            .bind(a)
            .bind(&q)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let twin = "harbour harbour harbour: the crane passed its inspection";
    add(twin, 1, 4.2).await;
    add("harbour log entry #", 400, 0.0).await;
    // Closer to the query than the twins, and without its word: the vector part's candidates.
    add("garden note #", 1_200, 5.5).await;
    add(twin, 1, 4.2).await;
    let twins: Vec<String> =
        sqlx::query_scalar("select id::text from memories where content = $1 order by seq")
            .bind(twin)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let (old, new) = (&twins[0], &twins[1]);

    let hits = search(&app, &key, json!({"query": query, "limit": 10})).await;
    let ids: Vec<&str> = hits.iter().map(|h| h["id"].as_str().unwrap()).collect();
    assert_eq!(ids[0], new.as_str(), "{:?}", contents(&hits));
    // The older twin is beyond what the keyword part reads, and no vector candidate.
    assert!(!ids.contains(&old.as_str()), "{:?}", contents(&hits));
}
