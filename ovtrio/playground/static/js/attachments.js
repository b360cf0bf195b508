// What goes with a message besides its text: images (data URLs, shown as thumbnails)
// and text files or PDFs ({name, text}, shown as chips); how a file is told apart.

import { h } from "./dom.js";

export function thumbnails(urls, onRemove = null) {
  return h(
    "div",
    { class: "attachments" },
    urls.map((url, i) => {
      const image = h("img", { class: "thumb", src: url, alt: `image ${i + 1}` });
      if (!onRemove) return image;
      const remove = h("button", { class: "thumb-remove", type: "button", title: "Remove", "aria-label": `Remove image ${i + 1}`, text: "✕", onclick: () => onRemove(i) });
      return h("span", { class: "thumb-box" }, image, remove);
    })
  );
}

export function fileChips(files, onRemove = null) {
  return h(
    "div",
    { class: "files" },
    files.map((file, i) =>
      h(
        "span",
        { class: "file-chip", title: `${file.text.length} characters` },
        h("span", { class: "file-name", text: file.name }),
        onRemove ? h("button", { class: "ghost small", type: "button", "aria-label": `Remove ${file.name}`, text: "✕", onclick: () => onRemove(i) }) : null
      )
    )
  );
}

export function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// A text file goes with the message as its text (a part of its own, named), and a PDF
// as the text PDF.js reads from it; a file is taken as text when the browser says so or
// its name ends as source code does.
const TEXT_NAMES = /\.(txt|md|markdown|csv|tsv|json|jsonl|xml|ya?ml|toml|ini|cfg|conf|log|py|js|mjs|ts|tsx|jsx|c|h|cc|cpp|hpp|rs|go|java|kt|rb|php|sh|bash|zsh|sql|html?|css|scss|tex|r|swift|lua|pl)$/i;
export const TEXT_LIMIT = 1024 * 1024;

export function isPdf(file) {
  return file.type === "application/pdf" || /\.pdf$/i.test(file.name || "");
}

export function isText(file) {
  return file.type.startsWith("text/") || /json|xml|javascript|yaml|toml|x-sh/.test(file.type) || TEXT_NAMES.test(file.name || "");
}
