import { test, expect, Page } from '@playwright/test';
import { execFileSync } from 'child_process';
import { createKey, hydrated, signUp, uniqueEmail } from './helpers';

/** `engram …` against the server's database (as an operator runs it beside the server). */
function engram(args: string[]): string {
  const bin = process.env.ENGRAM_BIN;
  const db = process.env.ENGRAM_E2E_DATABASE_URL;
  if (!bin || !db) throw new Error('ENGRAM_BIN and ENGRAM_E2E_DATABASE_URL must be set (scripts/test.sh sets them)');
  return execFileSync(bin, args, { env: { ...process.env, DATABASE_URL: db, ENGRAM_METRICS_BIND: 'off' }, encoding: 'utf8' });
}

async function waitCompleted(page: Page, key: string, taskId: string) {
  await expect.poll(async () => {
    const r = await page.request.get(`/api/v1/tasks/${taskId}`, { headers: { 'X-API-Key': key } });
    return (await r.json()).data.status;
  }, { timeout: 45_000 }).toBe('completed');
}

test('dashboard: totals and charts show the figures the API answers', async ({ page }) => {
  await signUp(page, uniqueEmail('dashboard'));
  await page.goto('/keys');
  await hydrated(page);
  const key = await createKey(page, 'dashboard');
  const tasks: string[] = [];
  for (const content of [
    'My daughter Mia is severely allergic to peanuts.',
    'We flew to Lisbon on the 3rd of May and stayed in Alfama.',
    'To deploy, run make release and then tag the commit.',
  ]) {
    const r = await page.request.post('/api/v1/memories', { headers: { 'X-API-Key': key }, data: { content } });
    expect(r.status()).toBe(200);
    tasks.push((await r.json()).task_id);
  }
  for (const t of tasks) await waitCompleted(page, key, t);
  const s = await page.request.post('/api/v1/memories/search', { headers: { 'X-API-Key': key }, data: { query: 'peanut allergy' } });
  expect(s.status()).toBe(200);

  await page.goto('/dashboard');
  await expect(page.getByTestId('total-memories')).toBeVisible();
  // The page's session reads the same figures from the API (a session call is not an API call,
  // so nothing changes between the two reads).
  const stats = await (await page.request.get('/api/stats')).json();
  const usage = await (await page.request.get('/api/stats/usage?days=30')).json();
  expect(stats.total_memories).toBe(3);
  await expect(page.getByTestId('total-memories')).toHaveText(String(stats.total_memories));
  await expect(page.getByTestId('api-calls-today')).toHaveText(String(stats.api_calls_today));
  await expect(page.getByTestId('total-projects')).toHaveText(String(stats.total_projects));

  const today = usage.daily[usage.daily.length - 1];
  expect(today.memories_created).toBe(3);
  const memBar = page.getByTestId('chart-memories').locator(`rect[data-date="${today.date}"]`);
  await expect(memBar).toHaveAttribute('data-value', String(today.memories_created));
  await expect(memBar.locator('title')).toHaveText(`${today.date}: 3 memories`);
  const callBar = page.getByTestId('chart-calls').locator(`rect[data-date="${today.date}"]`);
  await expect(callBar).toHaveAttribute('data-value', String(today.calls));
  expect(today.calls).toBeGreaterThanOrEqual(4);
  await expect(page.getByTestId('chart-memories').locator('rect.bar')).toHaveCount(30);
  for (const sector of stats.sectors) {
    await expect(page.getByTestId('chart-sectors').locator(`g[data-label="${sector.sector}"]`))
      .toHaveAttribute('data-value', String(sector.memories));
  }
  await expect(page.getByTestId('tasks-completed')).toHaveText(String(usage.daily.reduce((n: number, d: any) => n + d.tasks_completed, 0)));
  // Readable without JavaScript: the charts are in the server's HTML, with their labels.
  const html = await (await page.request.get('/dashboard')).text();
  expect(html).toContain('Memories created per day');
  expect(html).toContain(`${today.date}: 3 memories`);
});

test('plan: an account on a plan of 3 memories sees the fourth refused and the bar full', async ({ page }) => {
  const email = uniqueEmail('plan');
  await signUp(page, email);
  engram(['plan', 'define', 'e2e-three', '--memories', '3', '--display-name', 'Three', '--price', '$0 (test)']);
  engram(['plan', 'assign', email, 'e2e-three']);

  await page.goto('/projects/default');
  await hydrated(page);
  for (let i = 1; i <= 3; i++) {
    await page.getByTestId('memory-content').fill(`Memory number ${i} about the garden.`);
    await page.getByTestId('memory-add').click();
    await expect(page.getByTestId('task-status')).toHaveAttribute('data-status', 'completed', { timeout: 45_000 });
    await expect(page.getByTestId('memory')).toHaveCount(i);
  }
  await page.getByTestId('memory-content').fill('A fourth memory, one too many.');
  await page.getByTestId('memory-add').click();
  await expect(page.getByTestId('error-content')).toContainText('Quota exceeded: memories stored 3 of 3 on the Three plan (e2e-three)');
  await expect(page.getByTestId('memory')).toHaveCount(3);

  await page.goto('/plan');
  await expect(page.getByTestId('plan-name')).toHaveAttribute('data-plan', 'e2e-three');
  await expect(page.getByTestId('quota-memories-text')).toHaveText('3 of 3');
  await expect(page.getByTestId('quota-memories')).toHaveClass(/full/);
  await expect(page.getByTestId('quota-memories-warning')).toBeVisible();
  await expect(page.getByTestId('quota-projects-text')).toHaveText('1 (unlimited)');
  await expect(page.getByTestId('plan-e2e-three')).toContainText('(yours)');
});
