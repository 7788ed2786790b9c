import { expect, Page } from '@playwright/test';

export const password = 'correct-horse-42';

export function uniqueEmail(prefix: string): string {
  return `${prefix}-${Date.now()}-${Math.floor(Math.random() * 1e6)}@example.com`;
}

/** Waits until the page is hydrated: the wasm bundle has loaded and taken over the markup. */
export async function hydrated(page: Page) {
  await page.waitForFunction(() => (window as any).__engram_hydrated === true, null, { timeout: 30_000 });
}

export async function signUp(page: Page, email: string) {
  await page.goto('/signup');
  await hydrated(page);
  await page.getByTestId('signup-email').fill(email);
  await page.getByTestId('signup-password').fill(password);
  await page.getByTestId('signup-submit').click();
  await expect(page).toHaveURL(/\/install$/);
  await expect(page.getByTestId('who')).toHaveText(email);
}

export async function logIn(page: Page, email: string, pw = password) {
  await page.goto('/login');
  await hydrated(page);
  await page.getByTestId('login-email').fill(email);
  await page.getByTestId('login-password').fill(pw);
  await page.getByTestId('login-submit').click();
}

export async function createKey(page: Page, name: string): Promise<string> {
  await page.getByTestId('key-name').fill(name);
  await page.getByTestId('key-create').click();
  const value = page.getByTestId('new-key-value');
  await expect(value).toBeVisible();
  return (await value.textContent())!.trim();
}
