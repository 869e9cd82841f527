// Sends one message of each Segment type through a real Node SDK, then flushes:
//   node send.mjs <segment|rudderstack> <collector URL> <write key>
// Exits 0 once the SDK reports every batch delivered, 1 on any error it reports.
import { Analytics } from "@segment/analytics-node";
import RudderAnalytics from "@rudderstack/rudder-sdk-node";

const [sdk, host, writeKey] = process.argv.slice(2);
const errors = [];

const messages = [
  ["identify", { userId: "u1", traits: { email: "ada@example.com", plan: "pro" } }],
  ["track", { userId: "u1", event: "Order Completed", properties: { revenue: 42.5, currency: "EUR" } }],
  ["page", { userId: "u1", category: "Docs", name: "Install", properties: { url: "https://example.com/docs" } }],
  ["screen", { userId: "u1", name: "Home", properties: { tab: 2 } }],
  ["group", { userId: "u1", groupId: "g1", traits: { name: "Acme" } }],
  ["alias", { userId: "u1", previousId: "anon-1" }],
];

if (sdk === "segment") {
  const client = new Analytics({ writeKey, host, flushAt: 10, maxRetries: 2 });
  client.on("error", (error) => errors.push(String(error?.reason ?? error)));
  for (const [type, message] of messages) client[type](message);
  await client.closeAndFlush({ timeout: 20000 });
} else if (sdk === "rudderstack") {
  const client = new RudderAnalytics(writeKey, {
    dataPlaneUrl: host, flushAt: 10, retryCount: 2, logLevel: "error",
    errorHandler: (error) => errors.push(String(error)),
  });
  for (const [type, message] of messages) client[type](message);
  await client.flush();
} else {
  console.error(`unknown sdk ${sdk}`);
  process.exit(2);
}
if (errors.length) {
  console.error(errors.join("\n"));
  process.exit(1);
}
console.log(`${sdk}: sent ${messages.length} messages`);
