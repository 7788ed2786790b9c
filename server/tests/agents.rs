//! Machine accounts, machine stats and claims (API side), with the development mailbox.
mod common;

use common::*;
use serde_json::{json, Value};

const FP_A: &str = "machine-a-0123456789abcdef";
const FP_B: &str = "machine-b-0123456789abcdef";

async fn register_machine(app: &TestApp, fp: &str) -> Value {
    let (s, b) = app
        .post_json(
            "/api/v1/agents/auto-register",
            &json!({"machine_fingerprint": fp, "platform": "linux", "hostname": "build-box"}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
    b["data"].clone()
}

async fn claim_init(app: &TestApp, fp: &str, email: &str) -> (reqwest::StatusCode, Value) {
    app.post_json(
        "/api/v1/agents/claim/init",
        &json!({"machine_fingerprint": fp, "email": email}),
        None,
    )
    .await
}

async fn claim_verify(app: &TestApp, fp: &str, code: &str) -> (reqwest::StatusCode, Value) {
    app.post_json(
        "/api/v1/agents/claim/verify",
        &json!({"machine_fingerprint": fp, "verification_code": code}),
        None,
    )
    .await
}

fn wrong(code: &str) -> String {
    format!("{:06}", (code.parse::<u32>().unwrap() + 1) % 1_000_000)
}

#[tokio::test]
async fn auto_register_gives_a_new_key_each_time_on_one_pool() {
    let app = spawn_worker_app().await;
    let first = register_machine(&app, FP_A).await;
    assert_eq!(first["is_machine_account"], true);
    assert_eq!(first["project_id"], "default");
    assert_eq!(first["machine_fingerprint"], FP_A);
    assert!(first["user_id"].is_string());
    let second = register_machine(&app, FP_A).await;
    assert_eq!(first["user_id"], second["user_id"]);
    assert_ne!(first["api_key"], second["api_key"]);
    let (k1, k2) = (
        first["api_key"].as_str().unwrap(),
        second["api_key"].as_str().unwrap(),
    );

    let ids = app
        .store_all(
            k1,
            vec![json!({"content": "the build cache lives in /var/cache/ci"})],
        )
        .await;
    assert_eq!(
        app.get(&format!("/api/v1/memories/{}", ids[0]), Some(k2))
            .await
            .0,
        200,
        "keys of one machine share one pool"
    );

    // Another machine sees nothing of it.
    let other = register_machine(&app, FP_B).await;
    let k3 = other["api_key"].as_str().unwrap();
    assert_ne!(other["user_id"], first["user_id"]);
    assert_eq!(
        app.get(&format!("/api/v1/memories/{}", ids[0]), Some(k3))
            .await
            .0,
        404
    );
    assert_eq!(app.get("/api/v1/memories", Some(k3)).await.1["total"], 0);

    // The fingerprint is stored hashed only.
    let (hashed, raw): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where fingerprint_hash = sha256(convert_to($1, 'UTF8'))),
                count(*) filter (where position(convert_to($1, 'UTF8') in fingerprint_hash) > 0)
         from users",
    )
    .bind(FP_A)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((hashed, raw), (1, 0));
    let anywhere: i64 =
        sqlx::query_scalar("select count(*) from users u where u::text like '%' || $1 || '%'")
            .bind(FP_A)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(anywhere, 0);

    for (body, field) in [
        (json!({}), "machine_fingerprint"),
        (
            json!({"machine_fingerprint": "short"}),
            "machine_fingerprint",
        ),
        (
            json!({"machine_fingerprint": "has spaces in it 12345"}),
            "machine_fingerprint",
        ),
        (
            json!({"machine_fingerprint": FP_A, "platform": "amiga"}),
            "platform",
        ),
    ] {
        let (s, b) = app
            .post_json("/api/v1/agents/auto-register", &body, None)
            .await;
        assert_validation(s, &b, &["body", field]);
    }
}

#[tokio::test]
async fn machine_stats_reports_real_figures_to_the_machine_only() {
    let app = spawn_worker_app().await;
    let m = register_machine(&app, FP_A).await;
    let key = m["api_key"].as_str().unwrap();
    app.store_all(
        key,
        vec![
            json!({"content": "stats memory one"}),
            json!({"content": "stats memory two"}),
        ],
    )
    .await;
    let (s, b) = app
        .get(
            &format!("/api/v1/agents/machine-stats?machine_fingerprint={FP_A}"),
            Some(key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let d = &b["data"];
    assert_eq!(d["total_memories"], 2);
    assert_eq!(d["total_projects"], 1);
    // Two memory posts, the task polls of store_all, and this call: all counted.
    assert!(d["api_calls_24h"].as_i64().unwrap() >= 4, "{d}");
    let bytes: i64 = sqlx::query_scalar("select sum(pg_column_size(m.*))::bigint from memories m")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(d["storage_bytes"], bytes);
    assert!(d["storage_used"].as_str().unwrap().ends_with("KB"), "{d}");
    assert!(d["created_at"].as_str().unwrap().ends_with('Z'));

    // Counts survive a flush to the database, which also records when the key was last used.
    let before: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("select max(last_used_at) from api_keys")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(before.is_none());
    app.state.usage.flush(&app.pool).await.unwrap();
    let used: i64 =
        sqlx::query_scalar("select count(*) from api_keys where last_used_at is not null")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(used, 1, "the one key that made calls");
    let (_, again) = app
        .get(
            &format!("/api/v1/agents/machine-stats?machine_fingerprint={FP_A}"),
            Some(key),
        )
        .await;
    assert!(
        again["data"]["api_calls_24h"].as_i64().unwrap() > d["api_calls_24h"].as_i64().unwrap()
    );

    let other = register_machine(&app, FP_B).await;
    let (s, _) = app
        .get(
            &format!("/api/v1/agents/machine-stats?machine_fingerprint={FP_A}"),
            other["api_key"].as_str(),
        )
        .await;
    assert_eq!(s, 404);
    assert_eq!(
        app.get(
            &format!("/api/v1/agents/machine-stats?machine_fingerprint={FP_A}"),
            None
        )
        .await
        .0,
        401
    );
    let (s, b) = app.get("/api/v1/agents/machine-stats", Some(key)).await;
    assert_validation(s, &b, &["query", "machine_fingerprint"]);
}

#[tokio::test]
async fn a_claim_merges_projects_memories_and_keys_into_the_human_account() {
    let app = spawn_worker_app().await;
    // Keys are cached from here on: after the merge the machine's key must act for the human.
    app.until_listening().await;
    let (token, human_key) = app.user("owner@example.com").await;
    let m = register_machine(&app, FP_A).await;
    let mkey = m["api_key"].as_str().unwrap().to_string();
    app.post_json("/api/v1/projects", &json!({"name": "notes"}), Some(&mkey))
        .await;
    app.post_json(
        "/api/v1/projects",
        &json!({"name": "notes"}),
        Some(&human_key),
    )
    .await;
    app.post_json(
        "/api/v1/projects",
        &json!({"name": "only-machine"}),
        Some(&mkey),
    )
    .await;
    let machine_memories = app
        .store_all(&mkey, vec![json!({"content": "machine default memory about the kiln temperature"}), json!({"content": "machine notes memory about glaze recipes", "project_id": "notes"})])
        .await;

    // Conversations (system messages only: stored, not remembered): one with a client id the
    // human also uses, one in a project whose name clashes.
    let flush = |id: &str, project: &str| {
        json!({"conversation_id": id, "project_id": project,
        "messages": [{"role": "system", "content": format!("{id} in {project}")}]})
    };
    for (key, id, project) in [
        (&mkey, "chat-1", "default"),
        (&mkey, "chat-2", "notes"),
        (&human_key, "chat-1", "default"),
    ] {
        let (s, b) = app
            .post_json(
                "/api/v1/conversations/flush",
                &flush(id, project),
                Some(key),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }

    let (s, started) = claim_init(&app, FP_A, "Owner@Example.com").await;
    assert_eq!(s, 200, "{started}");
    let code = started["data"]["verification_code"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(code.len(), 6);
    assert!(started["data"]["expires_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    // The code went to the development mailbox, stored hashed in the claim.
    let mail: String = sqlx::query_scalar(
        "select text_body from dev_mailbox where to_address = 'owner@example.com'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(
        mail.contains(&code)
            && mail.contains("build-box")
            && mail.contains("linux")
            && mail.contains("/claim?machine=")
    );
    let stored: Vec<u8> = sqlx::query_scalar("select code_hash from claims")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains(&code));

    let (s, b) = claim_verify(&app, FP_A, &code).await;
    assert_eq!(s, 200, "{b}");
    let human_id = app.user_id(&token).await;
    assert_eq!(b["data"]["merged_to_user_id"], human_id.to_string());
    assert!(b["data"]["message"].is_string());

    // The memories are the human's now: listed, fetched and found by search, with both keys.
    let (_, list) = app.get("/api/v1/memories", Some(&human_key)).await;
    assert_eq!(list["total"], 2);
    for id in &machine_memories {
        assert_eq!(
            app.get(&format!("/api/v1/memories/{id}"), Some(&human_key))
                .await
                .0,
            200
        );
    }
    let (_, found) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "kiln temperature"}),
            Some(&human_key),
        )
        .await;
    assert_eq!(found["data"][0]["id"], machine_memories[0].as_str());
    assert_eq!(found["data"][0]["project_id"], "default");
    assert_eq!(
        app.get("/api/v1/memories", Some(&mkey)).await.1["total"],
        2,
        "the machine's key works on the human account"
    );

    // The conversations moved with their projects; the human keeps its own client id.
    let (_, convs) = app.get("/api/v1/conversations", Some(&human_key)).await;
    assert_eq!(convs["total"], 3, "{convs}");
    let external: Vec<Value> = convs["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["external_id"].clone())
        .collect();
    assert_eq!(
        external.iter().filter(|e| **e == json!("chat-1")).count(),
        1,
        "{convs}"
    );
    assert!(
        external.contains(&json!("chat-2")) && external.contains(&Value::Null),
        "{convs}"
    );
    let moved = convs["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["external_id"] == "chat-2")
        .unwrap();

    let (_, projects) = app.get("/api/v1/projects", Some(&human_key)).await;
    let renamed = projects["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str().unwrap().starts_with("notes-"))
        .unwrap();
    assert_eq!(
        moved["project_id"], renamed["id"],
        "the machine's conversation stays in the machine's (renamed) notes project"
    );
    let names: Vec<String> = projects["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.iter().filter(|n| *n == "default").count(), 1);
    assert!(names.contains(&"notes".to_string()) && names.contains(&"only-machine".to_string()));
    assert!(
        names.iter().any(|n| n.starts_with("notes-")),
        "clashing name suffixed: {names:?}"
    );

    // Claimed: auto-register answers 409, a second claim too; stats follow the human account.
    let (s, _) = app
        .post_json(
            "/api/v1/agents/auto-register",
            &json!({"machine_fingerprint": FP_A}),
            None,
        )
        .await;
    assert_eq!(s, 409);
    assert_eq!(claim_init(&app, FP_A, "owner@example.com").await.0, 409);
    let (s, stats) = app
        .get(
            &format!("/api/v1/agents/machine-stats?machine_fingerprint={FP_A}"),
            Some(&human_key),
        )
        .await;
    assert_eq!(s, 200, "{stats}");
    assert_eq!(stats["data"]["total_memories"], 2);
}

#[tokio::test]
async fn wrong_expired_and_replaced_codes_are_refused_and_the_fifth_wrong_voids_the_claim() {
    let app = spawn_app().await;
    app.user("guard@example.com").await;
    register_machine(&app, FP_A).await;

    let (s, b) = claim_init(&app, FP_A, "nobody@example.com").await;
    assert_eq!(s, 404, "{b}");
    let (s, _) = claim_init(&app, "unknown-machine-0123456789", "guard@example.com").await;
    assert_eq!(s, 404);
    assert_eq!(
        claim_verify(&app, FP_A, "123456").await.0,
        400,
        "no live claim"
    );

    let first = claim_init(&app, FP_A, "guard@example.com").await.1["data"]["verification_code"]
        .as_str()
        .unwrap()
        .to_string();
    let second = claim_init(&app, FP_A, "guard@example.com").await.1["data"]["verification_code"]
        .as_str()
        .unwrap()
        .to_string();
    if first != second {
        let (s, b) = claim_verify(&app, FP_A, &first).await;
        assert_eq!(s, 400, "the replaced code no longer works: {b}");
        assert_eq!(b["detail"], "Invalid or expired verification code");
    }
    // Four more wrong codes: the fifth wrong one voids the claim.
    let wrong_code = wrong(&second);
    let already = if first != second { 1 } else { 0 };
    for _ in already..4 {
        assert_eq!(claim_verify(&app, FP_A, &wrong_code).await.0, 400);
    }
    let (s, b) = claim_verify(&app, FP_A, &wrong_code).await;
    assert_eq!(s, 429, "{b}");
    assert_eq!(
        claim_verify(&app, FP_A, &second).await.0,
        400,
        "the void claim's right code is refused too"
    );

    // Expired.
    let code = claim_init(&app, FP_A, "guard@example.com").await.1["data"]["verification_code"]
        .as_str()
        .unwrap()
        .to_string();
    sqlx::query("update claims set expires_at = now() - interval '1 second'")
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(claim_verify(&app, FP_A, &code).await.0, 400);

    for (body, field) in [
        (
            json!({"machine_fingerprint": FP_A, "verification_code": "12345"}),
            "verification_code",
        ),
        (
            json!({"machine_fingerprint": FP_A, "verification_code": "12a456"}),
            "verification_code",
        ),
        (json!({"machine_fingerprint": FP_A}), "verification_code"),
    ] {
        let (s, b) = app
            .post_json("/api/v1/agents/claim/verify", &body, None)
            .await;
        assert_validation(s, &b, &["body", field]);
    }
    let (s, b) = claim_init(&app, FP_A, "not-an-email").await;
    assert_validation(s, &b, &["body", "email"]);
}

/// One attempt of the attacker: `(status, retry-after)`.
async fn attempt(app: &TestApp, path: &str, body: Value) -> (u16, Option<u64>, Value) {
    let r = app
        .http
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
    let status = r.status().as_u16();
    (status, retry, r.json().await.unwrap_or(Value::Null))
}

async fn mails_to(app: &TestApp, address: &str) -> i64 {
    sqlx::query_scalar("select count(*) from dev_mailbox where to_address = $1")
        .bind(address)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_claim_code_cannot_be_brute_forced_from_one_machine_or_many() {
    let app = spawn_app().await;
    app.user("victim@example.com").await;
    // The measured attack: re-init the claim again and again, four wrong guesses after each.
    register_machine(&app, FP_A).await;
    let (mut checked, mut refused_inits, mut guesses) = (0, 0, 0);
    for round in 0..40 {
        let (s, retry, b) = attempt(
            &app,
            "/api/v1/agents/claim/init",
            json!({"machine_fingerprint": FP_A, "email": "victim@example.com"}),
        )
        .await;
        match s {
            200 => {}
            429 => {
                assert!(retry.unwrap() >= 1, "{b}");
                refused_inits += 1;
            }
            other => panic!("init {round}: {other} {b}"),
        }
        for _ in 0..4 {
            guesses += 1;
            let (s, retry, b) = attempt(
                &app,
                "/api/v1/agents/claim/verify",
                json!({"machine_fingerprint": FP_A, "verification_code": format!("{:06}", 100_000 + guesses)}),
            )
            .await;
            match s {
                // A code was compared (and was wrong): the only answers that spend a guess.
                400 if b["detail"] == "Invalid or expired verification code" => checked += 1,
                429 => assert!(retry.unwrap() >= 1, "{b}"),
                other => panic!("verify: {other} {b}"),
            }
        }
    }
    let wrong_codes: i64 = sqlx::query_scalar(
        "select count(*) from claim_attempts where kind = 'wrong_code' and machine_id = (select max(id) from users where is_machine)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        wrong_codes, 10,
        "wrong codes compared for the machine in a day"
    );
    // Two rounds of four, then the ninth; the tenth wrong code spent the day's budget.
    assert_eq!(checked, 9, "guesses answered as merely wrong");
    assert_eq!(
        refused_inits, 37,
        "no claim restarts for a machine out of guesses"
    );
    assert_eq!(mails_to(&app, "victim@example.com").await, 3);
    // Once the day's wrong codes are spent, even the right code is not looked at.
    sqlx::query("update claim_attempts set at = at - interval '2 hours' where kind = 'init'")
        .execute(&app.pool)
        .await
        .unwrap();
    let (s, retry, b) = attempt(
        &app,
        "/api/v1/agents/claim/init",
        json!({"machine_fingerprint": FP_A, "email": "victim@example.com"}),
    )
    .await;
    assert_eq!(
        s, 429,
        "no new code is mailed to a machine out of guesses: {b}"
    );
    assert!(
        retry.unwrap() > 20 * 3600,
        "the wait lasts until the day passes"
    );

    // Many machines against one address: the e-mail's limits hold across them.
    let mut checked_all = 0;
    for m in 0..12 {
        let fp = format!("attacker-machine-{m:02}-0123456789");
        register_machine(&app, &fp).await;
        let (s, _, _) = attempt(
            &app,
            "/api/v1/agents/claim/init",
            json!({"machine_fingerprint": fp, "email": "victim@example.com"}),
        )
        .await;
        if s != 200 {
            assert_eq!(s, 429);
            continue;
        }
        for g in 0..5 {
            let (s, _, b) = attempt(
                &app,
                "/api/v1/agents/claim/verify",
                json!({"machine_fingerprint": fp, "verification_code": format!("{:06}", 200_000 + m * 10 + g)}),
            )
            .await;
            if s == 400 {
                checked_all += 1;
            } else {
                assert_eq!(s, 429, "{b}");
            }
        }
    }
    let wrong_to_victim: i64 = sqlx::query_scalar(
        "select count(*) from claim_attempts where kind = 'wrong_code' and email = 'victim@example.com'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(wrong_to_victim, 20, "wrong codes per e-mail per day");
    assert!(
        checked_all + checked < 30,
        "{} guesses in all",
        checked_all + checked
    );
    assert!(mails_to(&app, "victim@example.com").await <= 20);
    // Probing addresses spends the machine's init budget too.
    register_machine(&app, FP_B).await;
    for i in 0..5 {
        let (s, _, _) = attempt(
            &app,
            "/api/v1/agents/claim/init",
            json!({"machine_fingerprint": FP_B, "email": format!("nobody{i}@example.com")}),
        )
        .await;
        assert_eq!(s, 404);
    }
    let (s, retry, b) = attempt(
        &app,
        "/api/v1/agents/claim/init",
        json!({"machine_fingerprint": FP_B, "email": "nobody9@example.com"}),
    )
    .await;
    assert_eq!(s, 429, "{b}");
    assert!((3500..=3600).contains(&retry.unwrap()), "{retry:?}");

    // The legitimate flow still works: another owner's machine, one try.
    app.user("owner@example.com").await;
    let fp = "owners-laptop-0123456789abcdef";
    register_machine(&app, fp).await;
    let code = claim_init(&app, fp, "owner@example.com").await.1["data"]["verification_code"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(claim_verify(&app, fp, &wrong(&code)).await.0, 400);
    let (s, b) = claim_verify(&app, fp, &code).await;
    assert_eq!(s, 200, "{b}");
    // And the victim, logged in, can still confirm a claim on the portal's page: the per-e-mail
    // budget limits guessing through the agents API only.
    let fp = "victims-own-box-0123456789abcdef";
    let machine_id: i64 = register_machine(&app, fp).await["user_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    sqlx::query("update claim_attempts set at = at - interval '2 hours' where kind = 'init'")
        .execute(&app.pool)
        .await
        .unwrap();
    let (s, _, b) = attempt(
        &app,
        "/api/v1/agents/claim/init",
        json!({"machine_fingerprint": fp, "email": "victim@example.com"}),
    )
    .await;
    assert_eq!(
        s, 429,
        "the e-mail's wrong codes are spent for the agents API: {b}"
    );
    let victim: i64 = sqlx::query_scalar("select id from users where email = 'victim@example.com'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    // A claim started before the attack spent the budget (as it stood then).
    let code = "424242";
    sqlx::query(
        "insert into claims (machine_id, human_id, code_hash, expires_at) values ($1, $2, $3, now() + interval '10 minutes')",
    )
    .bind(machine_id)
    .bind(victim)
    .bind(app::core::crypto::sha256(&format!("{machine_id}:{code}")))
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(claim_verify(&app, fp, code).await.0, 429);
    let merged = app::core::claims::verify(
        &app.state,
        app::core::claims::ClaimRef::ForHuman {
            machine_id,
            human_id: victim,
        },
        code,
    )
    .await
    .unwrap();
    assert_eq!(merged, victim);
}

#[tokio::test]
async fn an_address_is_mailed_no_more_claim_codes_than_its_hourly_limit() {
    let mut settings = app::core::state::Settings::for_tests();
    settings.limits.claims.init_per_email_per_hour = 3;
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    app.user("popular@example.com").await;
    let mut answers = vec![];
    for m in 0..5 {
        let fp = format!("many-machines-{m:02}-0123456789");
        register_machine(&app, &fp).await;
        let (s, retry, _) = attempt(
            &app,
            "/api/v1/agents/claim/init",
            json!({"machine_fingerprint": fp, "email": "POPULAR@example.com"}),
        )
        .await;
        answers.push((s, retry.is_some()));
    }
    assert_eq!(
        answers,
        [
            (200, false),
            (200, false),
            (200, false),
            (429, true),
            (429, true)
        ]
    );
    assert_eq!(mails_to(&app, "popular@example.com").await, 3);
}

async fn register_from(app: &TestApp, fp: &str, forwarded: Option<&str>) -> u16 {
    let mut req = app
        .http
        .post(app.url("/api/v1/agents/auto-register"))
        .json(&json!({"machine_fingerprint": fp}));
    if let Some(f) = forwarded {
        req = req.header("x-forwarded-for", f);
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn x_forwarded_for_names_the_client_only_behind_a_trusted_proxy() {
    // No proxy trusted: the header is ignored, every request is the socket's peer.
    let mut settings = app::core::state::Settings::for_tests();
    settings.limits.auto_register_per_hour = 2;
    let app = spawn_with(Opts {
        settings: settings.clone(),
        ..Opts::default()
    })
    .await;
    let answers = [
        register_from(&app, "fwd-machine-000-0123456789", Some("203.0.113.1")).await,
        register_from(&app, "fwd-machine-001-0123456789", Some("203.0.113.2")).await,
        register_from(&app, "fwd-machine-002-0123456789", Some("203.0.113.3")).await,
    ];
    assert_eq!(answers, [200, 200, 429]);

    // The tests' loopback peer as the trusted proxy: each forwarded client has its own budget.
    settings.trusted_proxies =
        app::core::clientaddr::TrustedProxies::parse("127.0.0.1/32").unwrap();
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    let answers = [
        register_from(&app, "fwd-machine-100-0123456789", Some("203.0.113.1")).await,
        register_from(&app, "fwd-machine-101-0123456789", Some("203.0.113.1")).await,
        register_from(&app, "fwd-machine-102-0123456789", Some("203.0.113.1")).await,
        // Another client behind the same proxy.
        register_from(&app, "fwd-machine-103-0123456789", Some("203.0.113.2")).await,
        // The first client writing a fake hop of its own: the proxy's hop still names it.
        register_from(
            &app,
            "fwd-machine-104-0123456789",
            Some("9.9.9.9, 203.0.113.1"),
        )
        .await,
        // The proxy itself (no header).
        register_from(&app, "fwd-machine-105-0123456789", None).await,
    ];
    assert_eq!(answers, [200, 200, 429, 200, 429, 200]);
}

#[tokio::test]
async fn auto_register_is_rate_limited_per_client_address() {
    let mut settings = app::core::state::Settings::for_tests();
    settings.limits.auto_register_per_hour = 2;
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    register_machine(&app, FP_A).await;
    register_machine(&app, FP_B).await;
    let r = app
        .http
        .post(app.url("/api/v1/agents/auto-register"))
        .json(&json!({"machine_fingerprint": "machine-c-0123456789abcdef"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
}
