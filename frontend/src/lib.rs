//! The browser entry point: hydrates the server-rendered portal.
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(app::App);
    // A flag the browser tests wait for before they click.
    let _ = js_sys::Reflect::set(&js_sys::global(), &"__engram_hydrated".into(), &true.into());
}
