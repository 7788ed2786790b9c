import { test, expect } from '@playwright/test';
import { hydrated, signUp, uniqueEmail } from './helpers';

test('an agent registers and remembers; the human claims the machine with the mailed code and finds the memories', async ({ page, request }) => {
  const email = uniqueEmail('claimer');
  await signUp(page, email);

  const fingerprint = `e2e-machine-${Date.now()}-abcdef`;
  const reg = await request.post('/api/v1/agents/auto-register', { data: { machine_fingerprint: fingerprint, platform: 'linux', hostname: 'render-node' } });
  expect(reg.status()).toBe(200);
  const key = (await reg.json()).data.api_key;
  const task = await request.post('/api/v1/memories', { headers: { 'X-API-Key': key }, data: { content: 'The render farm license renews on the 3rd of May.' } });
  expect(task.status()).toBe(200);
  const taskId = (await task.json()).task_id;
  await expect.poll(async () => (await (await request.get(`/api/v1/tasks/${taskId}`, { headers: { 'X-API-Key': key } })).json()).data.status, { timeout: 45_000 }).toBe('completed');

  const init = await request.post('/api/v1/agents/claim/init', { data: { machine_fingerprint: fingerprint, email } });
  expect(init.status()).toBe(200);

  // The human reads the code in the development mailbox.
  await page.goto('/dev/mailbox');
  const mail = page.getByTestId('mail').filter({ hasText: 'render-node' }).first();
  await expect(mail).toBeVisible();
  const text = (await mail.getByTestId('mail-body').textContent())!;
  const code = text.match(/Your verification code: (\d{6})/)![1];
  const link = text.match(/(\/claim\?machine=\d+)/)![1];

  await page.goto(link);
  await hydrated(page);
  const pending = page.getByTestId('pending-claim').filter({ hasText: 'render-node' });
  await expect(pending.getByTestId('claim-moves')).toContainText('1 project(s) and 1 memory(ies)');
  await pending.getByTestId('claim-code').fill(code);
  await pending.getByTestId('claim-confirm').click();
  await expect(page.getByTestId('claim-done')).toBeVisible();
  await expect(page.getByTestId('machine-row')).toContainText('render-node');

  await page.goto('/projects/default');
  await expect(page.getByTestId('memory').first()).toContainText('render farm license');
});
