import { test, expect } from '@playwright/test';
import { hydrated } from './helpers';

test('the public model search: type, filter by provider and tools, sort by price, open one', async ({ page }) => {
  await page.goto('/models');
  await hydrated(page);
  // Results follow the typing, and the query goes into the URL.
  await page.getByTestId('model-q').fill('sonnet');
  await expect(page).toHaveURL(/[?&]q=sonnet/);
  const rows = page.getByTestId('model-row');
  await expect(rows.first()).toContainText(/sonnet/i);
  for (const text of await page.getByTestId('model-link').allInnerTexts()) {
    expect(text.toLowerCase()).toContain('sonnet');
  }

  await page.getByTestId('model-provider').selectOption('anthropic');
  await expect(page).toHaveURL(/provider=anthropic/);
  await page.getByTestId('model-cap-tools').check();
  await expect(page).toHaveURL(/capability=tools/);
  await expect(page.getByTestId('model-row-provider').first()).toHaveText('anthropic');
  for (const provider of await page.getByTestId('model-row-provider').allInnerTexts()) {
    expect(provider).toBe('anthropic');
  }
  for (const caps of await page.getByTestId('model-row-caps').allInnerTexts()) {
    expect(caps).toContain('tools');
  }

  await page.getByTestId('sort-price').click();
  await expect(page).toHaveURL(/sort=price/);
  await expect(page.getByTestId('model-row-provider').first()).toHaveText('anthropic');
  const prices = (await page.getByTestId('model-row-input-price').evaluateAll(
    (cells) => cells.map((c) => c.getAttribute('data-value') ?? ''),
  )).map((v) => (v === '' ? Infinity : Number(v)));
  expect(prices.length).toBeGreaterThan(1);
  expect([...prices].sort((a, b) => a - b)).toEqual(prices);

  // The page shows what the API answers for the same query.
  const api = await page.request.get('/api/v1/models/search?q=sonnet&provider=anthropic&capability=tools&sort=price');
  const ids = (await api.json()).data.map((m: { id: string }) => m.id);
  expect(await page.getByTestId('model-link').allInnerTexts()).toEqual(ids);

  // Open the cheapest.
  const first = page.getByTestId('model-link').first();
  const id = (await first.innerText()).trim();
  await first.click();
  await expect(page.getByTestId('model-detail')).toContainText(id);
  await expect(page.getByTestId('detail-provider')).toHaveText('anthropic');
  await expect(page.getByTestId('detail-context')).toContainText('tokens');
});

test('a shared search URL renders its results without JavaScript', async ({ browser }) => {
  const context = await browser.newContext({ javaScriptEnabled: false });
  const page = await context.newPage();
  await page.goto('/models?q=gpt-4o&sort=relevance');
  await expect(page.getByTestId('model-link').first()).toHaveText('gpt-4o');
  await expect(page.getByTestId('model-q')).toHaveValue('gpt-4o');
  // An id with a route prefix opens on its own page too.
  await page.goto('/models/azure/gpt-4o');
  await expect(page.getByTestId('detail-provider')).toHaveText('azure');
  await page.goto('/models?limit=0');
  await expect(page.getByTestId('model-errors')).toContainText('limit');
  await context.close();
});
