import { test, expect } from '@playwright/test';
import { hydrated, signUp, uniqueEmail } from './helpers';

test('projects: create, add a memory and watch its task complete without a reload, search by paraphrase in the project and across projects, delete', async ({ page }) => {
  await signUp(page, uniqueEmail('projects'));
  await page.goto('/projects');
  await hydrated(page);
  await page.getByTestId('project-name').fill('garden');
  await page.getByTestId('project-create').click();
  await expect(page.getByRole('link', { name: 'garden' })).toBeVisible();
  await page.getByRole('link', { name: 'garden' }).click();
  await expect(page.getByTestId('project-title')).toHaveText('garden');
  await hydrated(page);

  // A marker on the window survives only if the page is not reloaded.
  await page.evaluate(() => ((window as any).__noReload = true));
  await page.getByTestId('memory-content').fill('My sister adopted a golden retriever puppy named Biscuit.');
  await page.getByTestId('memory-add').click();
  await expect(page.getByTestId('task-status')).toHaveAttribute('data-status', 'completed', { timeout: 45_000 });
  await expect(page.getByTestId('memory')).toHaveCount(1);
  await expect(page.getByTestId('memory').first()).toContainText('Biscuit');
  await expect(page.getByTestId('memory').first().getByTestId('sector')).toHaveText(/episodic|semantic|procedural|emotional|reflective/);
  expect(await page.evaluate(() => (window as any).__noReload)).toBe(true);

  // Found by meaning, with no word in common.
  await page.getByTestId('search-query').fill('what kind of dog does my sibling have');
  await page.getByTestId('search-submit').click();
  const hit = page.getByTestId('search-hit').first();
  await expect(hit).toContainText('Biscuit');
  await expect(hit.getByTestId('score')).toContainText('score 0.');
  await hit.getByRole('link').click();
  await expect(page.getByTestId('memory-detail')).toContainText('Biscuit');

  // The same question across all projects, with the hit's sector.
  await page.goto('/search');
  await hydrated(page);
  await page.getByTestId('search-query').fill('what kind of dog does my sibling have');
  await page.getByTestId('search-submit').click();
  const anywhere = page.getByTestId('search-hit').first();
  await expect(anywhere).toContainText('Biscuit');
  await expect(anywhere.getByTestId('score')).toContainText('score 0.');
  await expect(anywhere.getByTestId('sector')).toHaveText(/episodic|semantic|procedural|emotional|reflective/);

  // Deleting the project says how many memories go.
  await page.goto('/projects');
  await hydrated(page);
  const row = page.getByTestId('project-row').filter({ hasText: 'garden' });
  await expect(row.getByTestId('memory-count')).toHaveText('1');
  await row.getByTestId('project-delete').click();
  await expect(row.getByTestId('delete-warning')).toContainText('1 memories');
  await row.getByTestId('project-delete-confirm').click();
  await expect(page.getByTestId('project-deleted')).toContainText('1 memories');
  await expect(page.getByTestId('project-row').filter({ hasText: 'garden' })).toHaveCount(0);
});
