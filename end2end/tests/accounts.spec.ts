import { test, expect } from '@playwright/test';
import { createKey, hydrated, logIn, password, signUp, uniqueEmail } from './helpers';

test('sign up, create a key shown once that works, revoke it and it stops working', async ({ page, request }) => {
  const email = uniqueEmail('keys');
  await signUp(page, email);
  await page.goto('/keys');
  await hydrated(page);

  const key = await createKey(page, 'laptop agent');
  expect(key).toMatch(/^engram_[A-Za-z0-9]{32,}$/);
  // The copy button reacts without a reload: the page is hydrated.
  await page.getByTestId('copy-key').click();
  await expect(page.getByTestId('copy-key')).toHaveText('Copied');

  const ok = await request.get('/api/v1/projects', { headers: { 'X-API-Key': key } });
  expect(ok.status()).toBe(200);
  expect((await ok.json()).data[0].id).toBe('default');

  // After a reload the key is only shown masked.
  await page.reload();
  await hydrated(page);
  await expect(page.getByTestId('new-key')).toHaveCount(0);
  const masked = page.getByTestId('masked-key').first();
  await expect(masked).toContainText('…');
  await expect(masked).toContainText(key.slice(-4));
  expect(await page.content()).not.toContain(key);

  // Revoking asks first, then the API refuses the key at once.
  await page.getByTestId('revoke').first().click();
  await page.getByTestId('revoke-confirm').click();
  await expect(page.getByTestId('no-keys')).toBeVisible();
  const refused = await request.get('/api/v1/projects', { headers: { 'X-API-Key': key } });
  expect(refused.status()).toBe(401);
});

test('a wrong password shows an error next to the field', async ({ page }) => {
  const email = uniqueEmail('wrongpw');
  await signUp(page, email);
  await page.getByTestId('logout').click();
  await expect(page).toHaveURL(/\/login$/);
  await logIn(page, email, 'not-the-password');
  await expect(page.getByTestId('error-password')).toContainText('Incorrect email or password');
  await logIn(page, email, password);
  await expect(page).toHaveURL(/\/dashboard$/);
});

test('sign-up errors show next to their fields', async ({ page }) => {
  const email = uniqueEmail('dup');
  await signUp(page, email);
  await page.getByTestId('logout').click();
  await page.goto('/signup');
  await hydrated(page);
  await page.getByTestId('signup-email').fill(email);
  await page.getByTestId('signup-password').fill(password);
  await page.getByTestId('signup-submit').click();
  await expect(page.getByTestId('error-email')).toContainText('already registered');
  await page.getByTestId('signup-email').fill(uniqueEmail('short'));
  await page.getByTestId('signup-password').evaluate((el: HTMLInputElement) => (el.value = 'short'));
  await page.getByTestId('signup-submit').click();
  await expect(page.getByTestId('error-password')).toContainText('at least 8');
});

test('logging out ends the session: protected pages send you to log in', async ({ page }) => {
  await signUp(page, uniqueEmail('logout'));
  await page.getByTestId('logout').click();
  await expect(page).toHaveURL(/\/login$/);
  await page.goto('/keys');
  await expect(page).toHaveURL(/\/login$/);
  await page.goto('/projects');
  await expect(page).toHaveURL(/\/login$/);
});
