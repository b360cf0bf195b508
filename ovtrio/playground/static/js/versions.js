// Versions of a conversation's turns. Editing a message or regenerating a reply keeps
// what it replaces: the message that starts a new version holds `versions`, every
// version's turns from that point on (the one shown is null there, it is the
// conversation's own tail), and `version`, the index of the one shown.

function detach(head) {
  const versions = head.versions || [null];
  const version = head.version || 0;
  delete head.versions;
  delete head.version;
  return { versions, version };
}

// Replace the turns from `index` on by `fresh` (their first message new), keeping the
// replaced ones as the previous version.
export function branch(conversation, index, fresh) {
  const tail = conversation.messages.slice(index);
  const { versions, version } = tail.length ? detach(tail[0]) : { versions: [], version: 0 };
  if (tail.length) versions[version] = tail;
  versions.push(null);
  fresh[0].versions = versions;
  fresh[0].version = versions.length - 1;
  conversation.messages = [...conversation.messages.slice(0, index), ...fresh];
}

// Show version `wanted` of the turns from `index` on.
export function switchVersion(conversation, index, wanted) {
  const head = conversation.messages[index];
  if (!head || !head.versions || wanted === head.version || !head.versions[wanted]) return false;
  const tail = conversation.messages.slice(index);
  const { versions, version } = detach(head);
  versions[version] = tail;
  const chosen = versions[wanted];
  versions[wanted] = null;
  chosen[0].versions = versions;
  chosen[0].version = wanted;
  conversation.messages = [...conversation.messages.slice(0, index), ...chosen];
  return true;
}
