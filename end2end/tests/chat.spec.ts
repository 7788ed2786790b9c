import { test, expect } from '@playwright/test';
import { hydrated, signUp, uniqueEmail } from './helpers';

// The stand-in upstream LLM `make test` starts (engram stand-in-llm); it echoes the user's
// message and lists the memories Engram injected.
const standin = process.env.ENGRAM_STANDIN_URL ?? 'http://127.0.0.1:3901/v1';

test('chat through the proxy: set the upstream, see the injected memories with scores, find the conversation', async ({ page }) => {
  await signUp(page, uniqueEmail('chat'));

  // A memory to be recalled, added on the project page.
  await page.goto('/projects/default');
  await hydrated(page);
  await page.getByTestId('memory-content').fill('My daughter Mia is severely allergic to peanuts.');
  await page.getByTestId('memory-add').click();
  await expect(page.getByTestId('task-status')).toHaveAttribute('data-status', 'completed', { timeout: 45_000 });

  await page.goto('/chat');
  await hydrated(page);
  await expect(page.getByTestId('upstream-source')).toContainText('No upstream');
  await page.getByTestId('upstream-url').fill(standin);
  await page.getByTestId('upstream-key').fill('sk-standin-secret');
  await page.getByTestId('upstream-model').fill('standin-small');
  await page.getByTestId('upstream-save').click();
  await expect(page.getByTestId('upstream-source')).toContainText('Your own upstream');
  // The key is never shown again, only its end.
  await expect(page.getByTestId('upstream-key')).toHaveAttribute('placeholder', /…cret/);
  await hydrated(page);

  await page.getByTestId('chat-message').fill('Which dishes should Mia avoid because of her peanut allergy?');
  await page.getByTestId('chat-send').click();
  const turn = page.getByTestId('chat-turn').first();
  await expect(turn.getByTestId('chat-reply')).toContainText('Stand-in reply to: Which dishes should Mia avoid', { timeout: 30_000 });
  // The reply was written with the memory, and the page shows it beside the reply with its score.
  await expect(turn.getByTestId('chat-reply')).toContainText('allergic to peanuts');
  const injected = turn.getByTestId('injected-memory').first();
  await expect(injected).toContainText('My daughter Mia is severely allergic to peanuts.');
  await expect(injected.getByTestId('injected-score')).toHaveText(/score 0\.\d{3}/);

  // A second message continues the same conversation.
  await page.getByTestId('chat-message').fill('Thanks, and desserts?');
  await page.getByTestId('chat-send').click();
  await expect(page.getByTestId('chat-turn')).toHaveCount(2, { timeout: 30_000 });
  await expect(page.getByTestId('chat-turn').nth(1).getByTestId('chat-reply')).toContainText('Thanks, and desserts?');

  // The conversations page lists it with its four messages; opening it shows each message
  // with the memory it became.
  await page.goto('/conversations');
  const row = page.getByTestId('conversation-row').first();
  await expect(row).toContainText('Which dishes should Mia avoid');
  await expect(row.getByTestId('message-count')).toHaveText('4');
  await row.getByRole('link').click();
  await expect(page.getByTestId('conversation-message')).toHaveCount(4);
  await expect(page.getByTestId('conversation-message').nth(1)).toContainText('Stand-in reply to');
  await expect(async () => {
    await page.reload();
    await expect(page.getByTestId('message-memory')).toHaveCount(4);
  }).toPass({ timeout: 45_000 });
});
