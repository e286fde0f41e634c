//! What the user types to `blink chat`, read as llama-cli reads it: a line ending in a
//! backslash continues on the next, and escapes such as `\n` are processed (unless
//! `--no-escape`). On a terminal, lines come from a line editor (rustyline), so a pasted
//! message may be longer than the 4095 bytes the terminal's own line discipline holds,
//! and earlier messages are a key away; from a pipe or a file, they are read as they are.

use std::io::{self, BufRead, Write};
use std::io::IsTerminal;

use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

use crate::common::process_escapes;

/// What the user typed next.
pub enum Input {
    Message(String),
    /// A message that could not be read as text; it was reported and dropped.
    Skipped,
    /// Ctrl-C at the prompt.
    Interrupted,
    End,
}

/// Where lines come from.
pub enum Reader {
    Terminal(DefaultEditor),
    Lines(io::Lines<io::StdinLock<'static>>),
}

/// One line read: text, or why there is none.
enum Line {
    Text(String),
    NotUtf8,
    Interrupted,
    End,
}

impl Reader {
    /// A line editor when standard input is a terminal (and one can be set up), else lines.
    pub fn new() -> Reader {
        if io::stdin().is_terminal() {
            if let Ok(editor) = DefaultEditor::new() {
                return Reader::Terminal(editor);
            }
        }
        Reader::Lines(io::stdin().lock().lines())
    }

    /// The next message, after a `> ` prompt; `escapes` processes its backslash escapes.
    pub fn message(&mut self, escapes: bool) -> io::Result<Input> {
        let mut text = String::new();
        let mut prompt = "\n> ";
        loop {
            match self.line(prompt)? {
                Line::Text(line) => match line.strip_suffix('\\') {
                    Some(part) => {
                        text.push_str(part);
                        text.push('\n');
                        prompt = "";
                    }
                    None => {
                        text.push_str(&line);
                        break;
                    }
                },
                Line::End if text.is_empty() => return Ok(Input::End),
                Line::End => break,
                Line::Interrupted => return Ok(Input::Interrupted),
                // The reader has consumed the line: say so, and go on with the next message.
                Line::NotUtf8 => {
                    eprintln!("error: that line is not UTF-8 text; it was ignored");
                    return Ok(Input::Skipped);
                }
            }
        }
        if !escapes {
            return Ok(Input::Message(text));
        }
        match String::from_utf8(process_escapes(&text)) {
            Ok(text) => Ok(Input::Message(text)),
            Err(_) => {
                eprintln!("error: that message is not UTF-8 once its escapes are processed; it was ignored (--no-escape takes them literally)");
                Ok(Input::Skipped)
            }
        }
    }

    fn line(&mut self, prompt: &str) -> io::Result<Line> {
        match self {
            Reader::Terminal(editor) => match editor.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = editor.add_history_entry(line.as_str());
                    }
                    Ok(Line::Text(line))
                }
                Err(ReadlineError::Eof) => Ok(Line::End),
                Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(ReadlineError::Io(e)) if e.kind() == io::ErrorKind::InvalidData => Ok(Line::NotUtf8),
                Err(ReadlineError::Io(e)) => Err(e),
                Err(e) => Err(io::Error::other(e)),
            },
            Reader::Lines(lines) => {
                let mut out = io::stdout().lock();
                out.write_all(prompt.as_bytes())?;
                out.flush()?;
                match lines.next() {
                    None => Ok(Line::End),
                    Some(Ok(line)) => Ok(Line::Text(line)),
                    Some(Err(e)) if e.kind() == io::ErrorKind::InvalidData => Ok(Line::NotUtf8),
                    Some(Err(e)) => Err(e),
                }
            }
        }
    }
}
