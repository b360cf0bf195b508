// OpenAI's JavaScript SDK (npm `openai`), unmodified, speaking through the server named
// by argv: for each format, the bytes of `audio.speech.create` read whole and read as a
// stream, and the events of an SSE stream, printed as one JSON line each
// {"call": name, "format": format, "sha256": hex, "bytes": count, "chunks": count} (SSE:
// "events", the event types in order, and "sha256" of the audio their deltas carry).
// tests/test_speech_api.py compares them with the Python SDK's.
import { createHash } from 'node:crypto'
import OpenAI from 'openai'

const [baseURL, model, input] = process.argv.slice(2)
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 })

function print(line) {
  process.stdout.write(JSON.stringify(line) + '\n')
}

function sha256(bytes) {
  return createHash('sha256').update(bytes).digest('hex')
}

for (const format of ['wav', 'pcm', 'flac', 'mp3', 'opus', 'aac']) {
  const whole = await client.audio.speech.create({ model, voice: 'alloy', input, response_format: format })
  const bytes = Buffer.from(await whole.arrayBuffer())
  print({ call: 'create', format, sha256: sha256(bytes), bytes: bytes.length })

  const streamed = await client.audio.speech.create({
    model, voice: 'alloy', input, response_format: format, stream_format: 'audio',
  })
  const chunks = []
  for await (const chunk of streamed.body) chunks.push(Buffer.from(chunk))
  const joined = Buffer.concat(chunks)
  print({ call: 'stream', format, sha256: sha256(joined), bytes: joined.length, chunks: chunks.length })
}

const sse = await client.audio.speech.create({ model, voice: 'alloy', input, response_format: 'pcm', stream_format: 'sse' })
const text = await sse.text()
const events = text.split('\n').filter((line) => line.startsWith('data: ')).map((line) => JSON.parse(line.slice(6)))
const audio = Buffer.concat(events.filter((e) => e.type === 'speech.audio.delta').map((e) => Buffer.from(e.audio, 'base64')))
print({ call: 'sse', format: 'pcm', events: events.map((e) => e.type), sha256: sha256(audio), bytes: audio.length })
