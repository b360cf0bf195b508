// Ollama's JavaScript client (npm `ollama`), unmodified, against the server named by
// argv: each call's result printed as one JSON line {"call": name, "result": ...}, or
// {"call": name, "error": message, "status": code} for a call the server refused.
// tests/test_ollama_frameworks.py reads and checks them.
import { Ollama } from 'ollama'

const [host, model, embedder] = process.argv.slice(2)
const ollama = new Ollama({ host })
const story = [{ role: 'user', content: 'Tell me a short story about a lighthouse keeper.' }]
const greedy = { temperature: 0, num_predict: 12 }
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather of a city.',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', description: "The city's name.", maxLength: 20 } },
      required: ['city'],
    },
  },
}

function print(call, result) {
  process.stdout.write(JSON.stringify({ call, result }) + '\n')
}

async function collect(stream) {
  const parts = []
  for await (const part of stream) parts.push(part)
  return parts
}

async function run(call, fn) {
  try {
    print(call, await fn())
  } catch (error) {
    process.stdout.write(JSON.stringify({ call, error: error.error ?? String(error), status: error.status_code }) + '\n')
  }
}

await run('chat', () => ollama.chat({ model, messages: story, options: greedy }))
await run('chat_stream', async () => collect(await ollama.chat({ model, messages: story, options: greedy, stream: true })))
await run('generate', () => ollama.generate({ model, prompt: 'The capital of France is', options: greedy }))
await run('generate_stream', async () =>
  collect(await ollama.generate({ model, prompt: 'The capital of France is', options: greedy, stream: true })),
)
await run('format', () =>
  ollama.chat({
    model,
    messages: [{ role: 'user', content: 'Is the sky blue?' }],
    format: { type: 'object', properties: { blue: { type: 'boolean' } }, required: ['blue'] },
    options: { num_predict: 40 },
  }),
)
const question = [{ role: 'user', content: 'What is the weather in Paris?' }]
const forced = { tool_choice: 'required', num_predict: 120, temperature: 0 }
await run('tool_call', () => ollama.chat({ model, messages: question, tools: [weatherTool], options: forced }))
await run('tool_result', async () => {
  const call = await ollama.chat({ model, messages: question, tools: [weatherTool], options: forced })
  const messages = [...question, call.message, { role: 'tool', content: 'sunny', tool_name: 'get_weather' }]
  return ollama.chat({ model, messages, tools: [weatherTool], options: { num_predict: 8 } })
})
await run('embed', () => ollama.embed({ model: embedder, input: ['The sky is blue.', 'Grass is green.'] }))
await run('embeddings', () => ollama.embeddings({ model: embedder, prompt: 'The sky is blue.' }))
await run('list', () => ollama.list())
await run('ps', () => ollama.ps())
await run('show', () => ollama.show({ model }))
await run('version', () => ollama.version())
await run('missing', () => ollama.chat({ model: 'no-such-model', messages: story }))
