#!/usr/bin/env node
// Launches one wire-protocol emulator for the kinesis-dataflow tests and ties
// its life to this launcher's standard input.
//
//   node harness/launch.js <kinesis|dynamodb> <port> <tlsPort-or-0> <logfile>
//
// With DYNALITE_PATH set, dynalite keeps its tables in that directory (LevelDB) instead of
// in memory, so they survive a restart.
//
// * The emulator's stdout/stderr are appended to <logfile>.
// * When our stdin reaches EOF (the test process that holds the write end of the
//   pipe exited, panicked or was SIGKILLed) the emulator is killed and we exit.
// * When the emulator exits on its own, we exit with its code.
//
// No npm dependencies: only Node's standard library.
'use strict';

const fs = require('fs');
const path = require('path');
const { spawn } = require('child_process');

function usage(msg) {
  process.stderr.write(
    `launch.js: ${msg}\n` +
      'usage: node harness/launch.js <kinesis|dynamodb> <port> <tlsPort-or-0> <logfile>\n',
  );
  process.exit(2);
}

const [kind, portArg, tlsPortArg, logfile] = process.argv.slice(2);
if (!kind || !portArg || tlsPortArg === undefined || !logfile) usage('missing arguments');
const port = Number(portArg);
const tlsPort = Number(tlsPortArg);
if (!Number.isInteger(port) || port <= 0 || port > 65535) usage(`bad port ${portArg}`);
if (!Number.isInteger(tlsPort) || tlsPort < 0 || tlsPort > 65535) usage(`bad tls port ${tlsPortArg}`);

const modules = path.join(__dirname, 'node_modules');
let cwd;
let args;
const env = { ...process.env };

switch (kind) {
  case 'kinesis': {
    cwd = path.join(modules, 'kinesis-local'); // it reads ./server.json
    // Absolute path so `pgrep -af kinesis-local` finds the process.
    args = [path.join(cwd, 'main.js')];
    Object.assign(env, {
      KINESIS_MOCK_PLAIN_PORT: String(port),
      // Always give the TLS listener its own port, or parallel instances
      // collide on the default 4567.
      KINESIS_MOCK_TLS_PORT: String(tlsPort || port + 1),
      LOG_LEVEL: 'ERROR',
      AWS_REGION: 'us-east-1',
      SHARD_LIMIT: '1000',
      CREATE_STREAM_DURATION: '0ms',
      DELETE_STREAM_DURATION: '0ms',
      MERGE_SHARDS_DURATION: '0ms',
      SPLIT_SHARD_DURATION: '0ms',
      UPDATE_SHARD_COUNT_DURATION: '0ms',
      REGISTER_STREAM_CONSUMER_DURATION: '0ms',
      DEREGISTER_STREAM_CONSUMER_DURATION: '0ms',
      START_STREAM_ENCRYPTION_DURATION: '0ms',
      STOP_STREAM_ENCRYPTION_DURATION: '0ms',
      UPDATE_STREAM_MODE_DURATION: '0ms',
    });
    break;
  }
  case 'dynamodb': {
    cwd = path.join(modules, 'dynalite');
    args = [
      path.join(cwd, 'cli.js'),
      '--host', '127.0.0.1',
      '--port', String(port),
      '--createTableMs', '0',
      '--deleteTableMs', '0',
      '--updateTableMs', '0',
    ];
    // A data directory keeps the tables across a restart (a test that stops DynamoDB).
    if (process.env.DYNALITE_PATH) args.push('--path', process.env.DYNALITE_PATH);
    break;
  }
  default:
    usage(`unknown emulator kind ${JSON.stringify(kind)}`);
}

const entry = path.join(cwd, kind === 'kinesis' ? 'main.js' : 'cli.js');
if (!fs.existsSync(entry)) {
  process.stderr.write(`launch.js: ${entry} is missing; run \`npm ci\` in ${__dirname}\n`);
  process.exit(3);
}

fs.mkdirSync(path.dirname(path.resolve(logfile)), { recursive: true });
const logFd = fs.openSync(logfile, 'a');
function note(msg) {
  try {
    fs.writeSync(logFd, `[launch.js ${new Date().toISOString()}] ${msg}\n`);
  } catch (_) {
    // the log is best effort
  }
}

note(`starting ${kind}: ${process.execPath} ${args.join(' ')} (cwd ${cwd}, port ${port}, tls ${tlsPort})`);
const child = spawn(process.execPath, args, {
  cwd,
  env,
  // The emulator must not hold our stdin: only we watch it.
  stdio: ['ignore', logFd, logFd],
});

let stopping = false;
function stop(reason) {
  if (stopping) return;
  stopping = true;
  note(`stopping ${kind} (pid ${child.pid}): ${reason}`);
  if (child.exitCode !== null || child.signalCode !== null) process.exit(0);
  try {
    child.kill('SIGTERM');
  } catch (_) {
    // already gone
  }
  // Give it a moment to exit cleanly, then make sure.
  setTimeout(() => {
    try {
      child.kill('SIGKILL');
    } catch (_) {
      // already gone
    }
    process.exit(0);
  }, 2000).unref();
}

child.on('error', (err) => {
  note(`failed to spawn ${kind}: ${err.stack || err}`);
  process.exit(4);
});

child.on('exit', (code, signal) => {
  note(`${kind} exited with code ${code} signal ${signal}`);
  if (stopping) process.exit(0);
  process.exit(code === null ? 1 : code);
});

// The life line: EOF (or any error) on stdin means the owner is gone.
process.stdin.on('end', () => stop('stdin reached EOF'));
process.stdin.on('close', () => stop('stdin closed'));
process.stdin.on('error', (err) => stop(`stdin error: ${err.message}`));
process.stdin.on('data', () => {}); // discard anything written to us
process.stdin.resume();

for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
  process.on(sig, () => stop(`launcher got ${sig}`));
}
