// pgmq-js, unmodified, through its public API against a database given on the command
// line: node scenario.js '{"host": ..., "port": ..., "database": ..., "queue": ...}'.
// Prints one JSON object: what each call returned, or the error it raised.
"use strict";

const { Pgmq } = require("pgmq-js");

async function attempt(fn) {
  try {
    return { value: await fn() };
  } catch (err) {
    return { error: err.message, code: err.code };
  }
}

function message(m) {
  return m && { msgId: m.msgId, readCount: m.readCount, message: m.message, vtIsDate: m.vt instanceof Date };
}

async function main() {
  const cfg = JSON.parse(process.argv[2]);
  const pgmq = await Pgmq.new(
    { host: cfg.host, port: cfg.port, database: cfg.database, user: cfg.user, password: "unused", ssl: false },
    { skipExtensionCreation: true },
  );
  const q = cfg.queue;
  const out = {};
  try {
    await pgmq.queue.create(q);
    await pgmq.queue.createUnlogged(q + "_unlogged");
    out.list = (await pgmq.queue.list())
      .filter((x) => x.name.startsWith(q))
      .map((x) => ({ name: x.name, isUnlogged: x.isUnlogged, isPartitioned: x.isPartitioned,
                     createdAtIsDate: !isNaN(x.createdAt.getTime()) }));
    const first = await pgmq.msg.send(q, { n: 1, text: "héllo" });
    const batch = await pgmq.msg.sendBatch(q, [{ n: 2 }, { n: 3 }]);
    const delayed = await pgmq.msg.send(q, { n: 4 }, 100);
    out.sent = [first, ...batch, delayed];
    out.readBatch = (await pgmq.msg.readBatch(q, 30, 10)).map(message);
    out.readWhileHidden = message(await pgmq.msg.read(q, 30)) ?? null;
    out.setVt = await attempt(async () => message(await pgmq.msg.setVt(q, first, 0)));
    out.archive = await pgmq.msg.archive(q, first);
    out.archiveUnknown = await pgmq.msg.archive(q, 999999);
    out.archiveBatch = await pgmq.msg.archiveBatch(q, [batch[0], 999999]);
    out.delete = await pgmq.msg.delete(q, batch[1]);
    out.deleteAgain = await pgmq.msg.delete(q, batch[1]);
    out.deleteBatch = await pgmq.msg.deleteBatch(q, [batch[1], 999999]);
    out.popDelayed = message(await pgmq.msg.pop(q)) ?? null;
    const metrics = await pgmq.queue.getMetrics(q);
    out.metrics = { queueName: metrics.queueName, queueLength: metrics.queueLength,
                    totalMessages: metrics.totalMessages, scrapeTimeIsDate: !isNaN(metrics.scrapeTime.getTime()) };
    out.allMetrics = (await pgmq.queue.getAllMetrics()).map((m) => m.queueName).filter((n) => n.startsWith(q));
    await pgmq.queue.purge(q);
    out.afterPurge = (await pgmq.queue.getMetrics(q)).queueLength;
    await pgmq.queue.detachArchive(q);
    out.sendUnknown = await attempt(() => pgmq.msg.send(q + "_nope", { n: 0 }));
    await pgmq.queue.drop(q);
    await pgmq.queue.drop(q + "_unlogged");
    out.listAfterDrop = (await pgmq.queue.list()).filter((x) => x.name.startsWith(q)).length;
  } finally {
    await pgmq.close();
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(1);
});
