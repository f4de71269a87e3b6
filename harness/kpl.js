// AWS's own aggregation library (aws-kinesis-agg, pinned in package.json) as an independent
// producer and reader of the KPL aggregation format, for the interoperability tests.
//
//   node kpl.js aggregate    stdin: [{partitionKey, explicitHashKey?, data (hex)}]
//                            stdout: [{partitionKey, explicitHashKey?, data (hex)}], the
//                            aggregated Kinesis records to put, in order
//   node kpl.js deaggregate  stdin: [{data (hex), partitionKey, sequenceNumber}]
//                            stdout: [{partitionKey, explicitPartitionKey?, sequenceNumber,
//                            subSequenceNumber, data (hex)}], checksums checked
'use strict';

const agg = require('aws-kinesis-agg');

function readStdin() {
  return new Promise((resolve) => {
    let text = '';
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', (chunk) => { text += chunk; });
    process.stdin.on('end', () => resolve(JSON.parse(text)));
  });
}

function fail(err) {
  process.stderr.write(`kpl.js: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
}

async function aggregate(records) {
  const input = records.map((r) => ({
    partitionKey: r.partitionKey,
    explicitHashKey: r.explicitHashKey,
    data: Buffer.from(r.data, 'hex'),
  }));
  const out = [];
  await new Promise((resolve, reject) => {
    agg.aggregate(
      input,
      (encoded, done) => {
        out.push({
          partitionKey: encoded.partitionKey,
          explicitHashKey: encoded.explicitHashKey,
          data: Buffer.from(encoded.data).toString('hex'),
        });
        done();
      },
      resolve,
      (err) => reject(err),
      1,
    );
  });
  return out;
}

async function deaggregate(records) {
  const out = [];
  for (const record of records) {
    const kinesisRecord = {
      partitionKey: record.partitionKey,
      sequenceNumber: record.sequenceNumber,
      data: Buffer.from(record.data, 'hex').toString('base64'),
    };
    const users = await new Promise((resolve, reject) => {
      agg.deaggregateSync(kinesisRecord, true, (err, result) => (err ? reject(err) : resolve(result)));
    });
    for (const u of users) {
      out.push({
        partitionKey: u.partitionKey,
        explicitPartitionKey: u.explicitPartitionKey,
        sequenceNumber: String(u.sequenceNumber),
        subSequenceNumber: u.subSequenceNumber,
        data: Buffer.from(u.data, 'base64').toString('hex'),
      });
    }
  }
  return out;
}

(async () => {
  const command = process.argv[2];
  const input = await readStdin();
  let output;
  if (command === 'aggregate') {
    output = await aggregate(input);
  } else if (command === 'deaggregate') {
    output = await deaggregate(input);
  } else {
    fail(`unknown command ${command}: aggregate or deaggregate`);
  }
  process.stdout.write(JSON.stringify(output));
})().catch(fail);
