// A Zeebe job worker written against the published @camunda8/sdk, as its
// users write one, pointed at a Drover gateway. tests/zeebe.rs runs it as a
// separate process and reads what it did from stdout: one line per event,
// "DROVER-TEST " and a JSON object (the client's own logs may interleave).
//
//   node worker.js poll|stream TYPE   work jobs of TYPE until stdin closes
//   node worker.js topology           print the topology and exit
//
// Each job's variables say what to do with it: {"action": "complete"}
// completes it with {"handledBy": <mode>, "n": <its n>}; "fail" fails it
// with one retry fewer; "throw" throws error code NO_FUNDS; "hold" keeps it
// without an answer until the activation times out (a stalled worker).
// Connection: ZEEBE_ADDRESS (host:port), plaintext, no OAuth.

const { Camunda8 } = require('@camunda8/sdk')

const [mode, type] = process.argv.slice(2)
const emit = (event) => process.stdout.write(`DROVER-TEST ${JSON.stringify(event)}\n`)

const camunda = new Camunda8({
  ZEEBE_ADDRESS: process.env.ZEEBE_ADDRESS,
  ZEEBE_GRPC_ADDRESS: process.env.ZEEBE_ADDRESS,
  CAMUNDA_OAUTH_DISABLED: true,
  CAMUNDA_AUTH_STRATEGY: 'NONE',
  CAMUNDA_SECURE_CONNECTION: false,
  ZEEBE_CLIENT_LOG_LEVEL: 'NONE',
})
const zeebe = camunda.getZeebeGrpcApiClient()

async function handle(job) {
  const { action, n } = job.variables
  emit({
    event: 'job',
    mode,
    key: job.key,
    type: job.type,
    action,
    n,
    retries: job.retries,
    worker: job.worker,
    variables: job.variables,
    customHeaders: job.customHeaders,
    processInstanceKey: job.processInstanceKey,
    bpmnProcessId: job.bpmnProcessId,
    tenantId: job.tenantId,
  })
  try {
    if (action === 'fail') {
      return await job.fail({ errorMessage: `attempt with ${job.retries} retries failed`, retries: job.retries - 1, retryBackOff: 0 })
    }
    if (action === 'throw') {
      return await job.error({ errorCode: 'NO_FUNDS', errorMessage: 'the balance is 0' })
    }
    if (action === 'hold') {
      return await new Promise(() => {})
    }
    const done = await job.complete({ handledBy: mode, n })
    emit({ event: 'completed', key: job.key, n })
    return done
  } catch (error) {
    emit({ event: 'error', key: job.key, n, message: String(error && error.message) })
    throw error
  }
}

async function main() {
  if (mode === 'topology') {
    const topology = await zeebe.topology()
    emit({ event: 'topology', topology })
    process.exit(0)
  }
  if (mode === 'poll') {
    zeebe.createWorker({
      taskType: type,
      worker: `node-${process.pid}`,
      timeout: 10000,
      maxJobsToActivate: 32,
      longPoll: 5000,
      pollInterval: 100,
      taskHandler: handle,
    })
  } else if (mode === 'stream') {
    await zeebe.streamJobs({ type, worker: `node-${process.pid}`, timeout: 10000, taskHandler: handle })
  } else {
    throw new Error(`unknown mode ${mode}`)
  }
  emit({ event: 'ready', mode })
  // Work until the test closes stdin.
  process.stdin.resume()
  process.stdin.on('end', async () => {
    await zeebe.close(2000).catch(() => {})
    process.exit(0)
  })
}

main().catch((error) => {
  emit({ event: 'fatal', message: String(error && error.stack) })
  process.exit(1)
})
