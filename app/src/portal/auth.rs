//! Sign-up, log-in, log-out and the navigation that knows who is logged in.
use leptos::prelude::*;
use leptos_router::components::A;
use serde::{Deserialize, Serialize};

use super::{field_error, FormOutcome};

/// Who is logged in, for the navigation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionUser {
    pub id: i64,
    pub email: String,
    pub development: bool,
}

#[server(prefix = "/portal/fn")]
pub async fn current_user() -> Result<Option<SessionUser>, ServerFnError> {
    use super::session::{server_error, state, user_id};
    let state = state()?;
    let Some(id) = user_id().await? else {
        return Ok(None);
    };
    let user = crate::core::accounts::find(&state.pool, id)
        .await
        .map_err(server_error)?;
    Ok(user.map(|u| SessionUser {
        id: u.id,
        email: u.email.unwrap_or_default(),
        development: !state.settings.production,
    }))
}

#[server(prefix = "/portal/fn")]
pub async fn sign_up(email: String, password: String) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, log_in, state};
    use crate::core::{accounts, validate::Fields};
    let state = state()?;
    let mut fields = Fields::from_json_body(
        serde_json::json!({"email": email, "password": password})
            .to_string()
            .as_bytes(),
    )
    .map_err(|e| ServerFnError::new(e.user_message()))?;
    let (email, password) = accounts::read_credentials(&mut fields, "email");
    if let Err(e) = fields.finish() {
        return form_error(e, "email");
    }
    let ip = super::session::client_key(&state).await;
    if let Err(e) = state
        .limiter
        .hit(
            &format!("register:{ip}"),
            state.settings.limits.register_per_hour,
            std::time::Duration::from_secs(3600),
        )
        .await
    {
        return form_error(e, "email");
    }
    match accounts::register(&state.pool, &email, &password).await {
        Ok(user) => {
            log_in(user.id).await?;
            leptos_axum::redirect("/install");
            Ok(FormOutcome::message("Welcome to Engram"))
        }
        Err(e) => form_error(e, "email"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn log_in(email: String, password: String) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, state};
    use crate::core::accounts;
    let state = state()?;
    let email = email.trim().to_lowercase();
    if email.is_empty() {
        return Ok(FormOutcome::error("email", "Enter your e-mail address"));
    }
    if let Err(e) = state
        .limiter
        .hit(
            &format!("login:{email}"),
            state.settings.limits.login_per_minute,
            std::time::Duration::from_secs(60),
        )
        .await
    {
        return form_error(e, "password");
    }
    match accounts::authenticate(&state.pool, &email, &password).await {
        Ok(id) => {
            super::session::log_in(id).await?;
            leptos_axum::redirect("/dashboard");
            Ok(FormOutcome::message("Logged in"))
        }
        Err(e) => form_error(e, "password"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn log_out() -> Result<(), ServerFnError> {
    super::session::log_out().await?;
    leptos_axum::redirect("/login");
    Ok(())
}

#[component]
pub fn Nav() -> impl IntoView {
    let logout = ServerAction::<LogOut>::new();
    let location = leptos_router::hooks::use_location();
    // Refetched on every navigation, so logging in or out shows at once.
    let user = Resource::new(
        move || (logout.version().get(), location.pathname.get()),
        |_| current_user(),
    );
    view! {
        <header class="nav">
            <A href="/" attr:class="brand">"Engram"</A>
            <Suspense fallback=|| ()>
                {move || Suspend::new(async move {
                    match user.await {
                        Ok(Some(u)) => view! {
                            <nav>
                                <A href="/dashboard">"Dashboard"</A>
                                <A href="/projects">"Projects"</A>
                                <A href="/search">"Search"</A>
                                <A href="/chat">"Chat"</A>
                                <A href="/conversations">"Conversations"</A>
                                <A href="/keys">"API keys"</A>
                                <A href="/install">"Connect"</A>
                                <A href="/claim">"Machines"</A>
                                <A href="/models">"Models"</A>
                                <A href="/plan">"Plan"</A>
                                {u.development.then(|| view! { <A href="/dev/mailbox">"Mailbox"</A> })}
                                <span class="who" data-test-id="who">{u.email.clone()}</span>
                                <ActionForm action=logout attr:class="inline">
                                    <button type="submit" class="link" data-test-id="logout">"Log out"</button>
                                </ActionForm>
                            </nav>
                        }.into_any(),
                        _ => view! {
                            <nav>
                                <A href="/install">"Connect"</A>
                                <A href="/models">"Models"</A>
                                <A href="/login">"Log in"</A>
                                <A href="/signup">"Sign up"</A>
                            </nav>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </header>
    }
}

#[component]
pub fn SignupPage() -> impl IntoView {
    let action = ServerAction::<SignUp>::new();
    let value = move || action.value().get();
    view! {
        <section class="card narrow">
            <h1>"Create your account"</h1>
            <ActionForm action=action>
                <label>"E-mail"<input type="email" name="email" required autocomplete="email" data-test-id="signup-email"/></label>
                {field_error(value, "email")}
                <label>"Password (8 characters or more)"<input type="password" name="password" required autocomplete="new-password" data-test-id="signup-password"/></label>
                {field_error(value, "password")}
                <button type="submit" data-test-id="signup-submit">"Sign up"</button>
            </ActionForm>
            <p>"Already registered? "<A href="/login">"Log in"</A></p>
        </section>
    }
}

#[component]
pub fn LoginPage() -> impl IntoView {
    let action = ServerAction::<LogIn>::new();
    let value = move || action.value().get();
    view! {
        <section class="card narrow">
            <h1>"Log in"</h1>
            <ActionForm action=action>
                <label>"E-mail"<input type="email" name="email" required autocomplete="email" data-test-id="login-email"/></label>
                {field_error(value, "email")}
                <label>"Password"<input type="password" name="password" required autocomplete="current-password" data-test-id="login-password"/></label>
                {field_error(value, "password")}
                <button type="submit" data-test-id="login-submit">"Log in"</button>
            </ActionForm>
            <p>"New here? "<A href="/signup">"Create an account"</A></p>
        </section>
    }
}
