// Speech for the message box: which files are audio, a recording from the microphone
// (MediaRecorder, WebM/Opus where the browser writes it) and text put in at the cursor.
// The page offers these only when /v1/models lists a model of kind "transcription".

const AUDIO_NAMES = /\.(wav|mp3|mpga|mpeg|m4a|mp4|aac|ogg|oga|opus|flac|webm|weba)$/i;

export function isAudio(file) {
  return (file.type || "").startsWith("audio/") || AUDIO_NAMES.test(file.name || "");
}

// Where there is no microphone API (an insecure origin, an old browser) the button is
// not offered.
export function canRecord() {
  return Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia && window.MediaRecorder);
}

const PREFERRED = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/mp4"];

// One recording: start() asks for the microphone (the browser may ask the user), stop()
// ends it and gives {blob, name}; the microphone is released either way.
export class Recording {
  constructor() {
    this.chunks = [];
    this.recorder = null;
    this.stream = null;
  }

  async start() {
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const mimeType = PREFERRED.find((type) => MediaRecorder.isTypeSupported(type));
    try {
      this.recorder = new MediaRecorder(this.stream, mimeType ? { mimeType } : {});
    } catch (error) {
      this.release();
      throw error;
    }
    this.recorder.ondataavailable = (event) => event.data.size && this.chunks.push(event.data);
    this.recorder.start();
  }

  stop() {
    return new Promise((resolve) => {
      this.recorder.onstop = () => {
        this.release();
        const type = this.recorder.mimeType || "audio/webm";
        const extension = type.includes("ogg") ? "ogg" : type.includes("mp4") ? "m4a" : "webm";
        resolve({ blob: new Blob(this.chunks, { type }), name: "recording." + extension });
      };
      this.recorder.stop();
    });
  }

  release() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
  }
}

// `text` put in the box at its cursor (replacing a selection), spaced from the words
// either side, the cursor left after it.
export function insertAtCursor(box, text) {
  const start = box.selectionStart ?? box.value.length;
  const end = box.selectionEnd ?? start;
  const before = box.value.slice(0, start);
  const after = box.value.slice(end);
  const piece = (before && !/\s$/.test(before) ? " " : "") + text + (after && !/^\s/.test(after) ? " " : "");
  box.value = before + piece + after;
  const cursor = before.length + piece.length;
  box.setSelectionRange(cursor, cursor);
  box.dispatchEvent(new Event("input", { bubbles: true }));
}
