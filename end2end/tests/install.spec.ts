import { test, expect } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { hydrated, signUp, uniqueEmail } from './helpers';

test('a new user lands on the install guide, creates a key there, and its curl snippet works', async ({ page, baseURL }) => {
  await signUp(page, uniqueEmail('install'));
  await hydrated(page);
  await expect(page.getByTestId('base-url')).toHaveText(baseURL!);
  const curl = page.getByTestId('snippet-curl');
  await expect(curl).toContainText('engram_YOUR_API_KEY');

  await page.getByTestId('install-key-create').click();
  await expect(page.getByTestId('install-key-state')).toContainText('Key created');
  await expect(curl).not.toContainText('engram_YOUR_API_KEY');
  for (const id of ['python', 'memoryx', 'javascript', 'mcp-claude', 'mcp-cursor', 'mcp-vscode']) {
    await expect(page.getByTestId(`snippet-${id}`)).toContainText('engram_');
    await expect(page.getByTestId(`snippet-${id}`)).not.toContainText('engram_YOUR_API_KEY');
  }
  await expect(page.getByTestId('snippet-mcp-cursor')).toContainText(`${baseURL}/mcp`);

  // Run the snippet exactly as shown: it stores a memory and searches.
  const snippet = (await curl.innerText()).trim();
  const out = execFileSync('bash', ['-c', snippet], { encoding: 'utf8' });
  const [stored] = out.trim().split('\n');
  expect(JSON.parse(stored)).toMatchObject({ success: true, status: 'pending' });
  expect(out).toContain('"query":"where does Ana like to sit?"');

  // The agent guide is public plain text naming this server.
  const guide = await page.request.get('/agent-guide');
  expect(guide.headers()['content-type']).toContain('text/plain');
  expect(await guide.text()).toContain(`${baseURL}/api/v1/agents/auto-register`);
});

test('the navigation links the install guide, and the API reference loads without a CDN', async ({ page }) => {
  const remote: string[] = [];
  page.on('request', (r) => { if (!r.url().startsWith('http://127.0.0.1')) remote.push(r.url()); });
  await page.goto('/');
  await page.getByRole('link', { name: 'Connect' }).first().click();
  await expect(page).toHaveURL(/\/install$/);
  await page.goto('/api/docs');
  await expect(page.locator('.swagger-ui .info .title')).toContainText('Engram API');
  await expect(page.locator('.opblock-summary-path').first()).toBeVisible();
  expect(remote).toEqual([]);
});
