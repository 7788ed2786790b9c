//! Outgoing mail: SMTP when a mail URL is configured, otherwise the development mailbox (kept in
//! the database, written to the log, listed on a development-only portal page).
use askama::Template;
use sqlx::PgConnection;

use super::error::AppResult;
use super::state::Settings;

/// The claim-code message (text and HTML bodies are askama templates).
#[derive(Debug, Clone)]
pub struct ClaimMail {
    pub code: String,
    pub hostname: String,
    pub platform: String,
    pub projects: i64,
    pub memories: i64,
    pub link: String,
    pub expires_minutes: i64,
}

#[derive(Template)]
#[template(path = "claim_code.txt")]
struct ClaimText<'a> {
    m: &'a ClaimMail,
}

#[derive(Template)]
#[template(path = "claim_code.html")]
struct ClaimHtml<'a> {
    m: &'a ClaimMail,
}

pub async fn send_claim_code(
    db: &mut PgConnection,
    settings: &Settings,
    to: &str,
    m: &ClaimMail,
) -> AppResult<()> {
    let subject = format!("Your Engram claim code for {}", m.hostname);
    let text = ClaimText { m }.render().map_err(anyhow::Error::from)?;
    let html = ClaimHtml { m }.render().map_err(anyhow::Error::from)?;
    send(db, settings, to, &subject, &text, &html).await
}

async fn send(
    db: &mut PgConnection,
    settings: &Settings,
    to: &str,
    subject: &str,
    text: &str,
    html: &str,
) -> AppResult<()> {
    match &settings.smtp_url {
        Some(url) => super::smtp::send(url, &settings.mail_from, to, subject, text, html)
            .await
            .map_err(Into::into),
        None => {
            sqlx::query("insert into dev_mailbox (to_address, subject, text_body, html_body) values ($1, $2, $3, $4)")
                .bind(to)
                .bind(subject)
                .bind(text)
                .bind(html)
                .execute(db)
                .await?;
            tracing::info!(mail.to = %to, mail.subject = %subject, "development mailbox: message stored (no SMTP configured)");
            Ok(())
        }
    }
}

/// The development mailbox, newest first.
pub async fn dev_mailbox(pool: &sqlx::PgPool) -> AppResult<Vec<crate::types::MailView>> {
    let rows: Vec<(i64, String, String, String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("select id, to_address, subject, text_body, created_at from dev_mailbox order by id desc limit 100").fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, to_address, subject, text_body, created_at)| crate::types::MailView {
                id,
                to_address,
                subject,
                text_body,
                created_at: super::time::iso(created_at),
            },
        )
        .collect())
}
