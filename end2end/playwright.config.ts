import { defineConfig } from '@playwright/test';

// Debian's Chromium, driven by Playwright; nothing downloads a browser.
export default defineConfig({
  testDir: './tests',
  timeout: 60_000,
  expect: { timeout: 15_000 },
  fullyParallel: false,
  workers: 1,
  reporter: [['list']],
  use: {
    baseURL: process.env.ENGRAM_BASE_URL ?? 'http://127.0.0.1:3100',
    launchOptions: {
      executablePath: '/usr/bin/chromium',
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
             '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    },
    trace: 'off',
    testIdAttribute: 'data-test-id',
  },
});
