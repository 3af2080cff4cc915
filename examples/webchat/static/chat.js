// The page's side of the chat: operations the server may call, notifications it sends,
// and requests to the server. `gotalk` comes from /gotalk/gotalk.js.
'use strict';

const myName = new URLSearchParams(location.search).get('name') ||
  'guest-' + Math.floor(Math.random() * 10000);
const $ = (id) => document.getElementById(id);

// The server calls this as soon as we connect; returning a value answers the request.
gotalk.handle('whoami', () => myName);

// Broadcasts from the server.
gotalk.handleNotification('message', showMessage);
gotalk.handleNotification('users', (names) => {
  $('users').replaceChildren(...names.map((name) => item(name)));
});

// One connection, kept open: after a drop it reconnects (0.5 s, then up to 5 s apart).
const sock = gotalk.connection()
  .on('open', async () => {
    setStatus('online');
    try {
      const history = await sock.request('history');
      $('messages').replaceChildren();
      history.forEach(showMessage);
    } catch (err) {
      $('error').textContent = 'no history: ' + err.message;
    }
  })
  .on('close', () => setStatus('offline'));

$('compose').addEventListener('submit', async (event) => {
  event.preventDefault();
  const text = $('text').value;
  try {
    await sock.request('send', text);
    $('text').value = '';
    $('error').textContent = '';
  } catch (err) {
    $('error').textContent = 'not sent: ' + err.message;
  }
});

function showMessage(message) {
  const when = new Date(message.time * 1000).toLocaleTimeString();
  const li = item(message.text);
  li.prepend(Object.assign(document.createElement('b'), { textContent: message.sender }));
  li.append(Object.assign(document.createElement('time'), { textContent: when }));
  $('messages').append(li);
  li.scrollIntoView({ block: 'end' });
}

function item(text) {
  const li = document.createElement('li');
  li.append(document.createTextNode(text));
  return li;
}

function setStatus(status) {
  $('status').textContent = status;
  $('status').className = status;
}

$('me').textContent = myName;
