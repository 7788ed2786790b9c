//! SMTP delivery through lettre (plain on loopback, STARTTLS or TLS as the URL says:
//! `smtp://host:25`, `smtp://user:pass@host:587?tls=required`, `smtps://host:465`).
use lettre::message::MultiPart;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

pub async fn send(
    url: &str,
    from: &str,
    to: &str,
    subject: &str,
    text: &str,
    html: &str,
) -> anyhow::Result<()> {
    let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)?
        .timeout(Some(std::time::Duration::from_secs(15)))
        .build();
    let message = Message::builder()
        .from(from.parse()?)
        .to(to.parse()?)
        .subject(subject)
        .multipart(MultiPart::alternative_plain_html(
            text.to_string(),
            html.to_string(),
        ))?;
    transport.send(message).await?;
    Ok(())
}
