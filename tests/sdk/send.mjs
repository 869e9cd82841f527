// Sends through a real Node SDK, then flushes:
//   node send.mjs <segment|rudderstack|jitsu> <collector URL> <write key> [ticks]
// Without ticks: one message of each Segment type (jitsu: of each type @jitsu/js has).
// With ticks: that many tracks, in batches of 50 over about 5 s, retried up to 20 times
// each (the kill test; not jitsu, which sends each call once and never retries).
// Exits 0 once the SDK reports every batch delivered, 1 on any error it reports.
import { Analytics } from "@segment/analytics-node";
import RudderAnalytics from "@rudderstack/rudder-sdk-node";
import jitsu from "@jitsu/js";

const [sdk, host, writeKey, ticks] = process.argv.slice(2);
const errors = [];
const pause = (ms) => new Promise((done) => setTimeout(done, ms));

const everyType = [
  ["identify", { userId: "u1", traits: { email: "ada@example.com", plan: "pro" } }],
  ["track", { userId: "u1", event: "Order Completed", properties: { revenue: 42.5, currency: "EUR" } }],
  ["page", { userId: "u1", category: "Docs", name: "Install", properties: { url: "https://example.com/docs" } }],
  ["screen", { userId: "u1", name: "Home", properties: { tab: 2 } }],
  ["group", { userId: "u1", groupId: "g1", traits: { name: "Acme" } }],
  ["alias", { userId: "u1", previousId: "anon-1" }],
];

async function send(client) {
  if (!ticks) {
    for (const [type, message] of everyType) client[type](message);
    return everyType.length;
  }
  for (let n = 0; n < Number(ticks); n++) {
    client.track({ userId: `u${n % 7}`, event: "Tick", properties: { n } });
    if (n % 10 === 9) await pause(15);
  }
  return Number(ticks);
}

const flushAt = ticks ? 50 : 10;
const retries = ticks ? 20 : 2;
let sent;
if (sdk === "segment") {
  const client = new Analytics({ writeKey, host, flushAt, maxRetries: retries });
  client.on("error", (error) => errors.push(String(error?.reason ?? error)));
  sent = await send(client);
  // On timeout, closeAndFlush resolves and drops what is left without an error.
  await client.closeAndFlush({ timeout: 240000 });
} else if (sdk === "rudderstack") {
  const client = new RudderAnalytics(writeKey, {
    dataPlaneUrl: host, flushAt, retryCount: retries, logLevel: "error",
    errorHandler: (error) => errors.push(String(error)),
  });
  sent = await send(client);
  await client.flush();
} else if (sdk === "jitsu") {
  // Jitsu 2's SDK from a server: s2s posts to /api/s/s2s/<type>, X-Write-Key id:secret.
  const client = jitsu.jitsuAnalytics({
    host, writeKey, s2s: true, errorPolicy: (message) => errors.push(message),
  });
  await client.identify("u1", { email: "ada@example.com", plan: "pro" });
  await client.track("Order Completed", { revenue: 42.5, currency: "EUR" });
  await client.page("Install", { category: "Docs", url: "https://example.com/docs" });
  await client.group("g1", { name: "Acme" });
  sent = 4;
} else {
  console.error(`unknown sdk ${sdk}`);
  process.exit(2);
}
if (errors.length) {
  console.error(errors.join("\n"));
  process.exit(1);
}
console.log(`${sdk}: sent ${sent} messages`);
